"""The decode kernel under torch.compile: one operator in the graph (no break), the dense
product's values, and the same bits as the eager layer. One tiny layer: compiling is slow."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from convergent.sparse.decode_kernels import IndexedLinear, indexed_linear

OUT, IN = 12, 16


def _layer(dtype: torch.dtype) -> tuple[IndexedLinear, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(OUT, IN, generator=generator)
    weight = (weight * (torch.rand(OUT, IN, generator=generator) < 0.4)).to(dtype)
    bias = torch.randn(OUT, generator=generator).to(dtype)
    return IndexedLinear(weight, bias), weight, bias


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_compiled_decode_layer_is_the_dense_product_and_the_eager_layer(dtype, rows):
    layer, weight, bias = _layer(dtype)
    inputs = torch.randn(1, rows, IN, generator=torch.Generator().manual_seed(1)).to(dtype)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)  # a graph break raises
    with torch.no_grad():
        got, eager = compiled(inputs), layer(inputs)
    # torch's dense product in float64 over the same (rounded) values; then rounded to dtype
    expected = inputs.double() @ weight.double().T + bias.double()
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # float32 sums; bfloat16's rounding
    assert got.shape == (1, rows, OUT) and got.dtype == dtype
    assert torch.allclose(got.double(), expected, rtol=tolerance, atol=tolerance)
    assert torch.equal(got, eager)


def test_the_operators_fake_gives_the_output_shape_and_dtype():
    layer, _, _ = _layer(torch.bfloat16)
    with FakeTensorMode() as mode:
        inputs = mode.from_tensor(torch.randn(2, 5, IN, dtype=torch.bfloat16))
        columns, values = mode.from_tensor(layer.columns), mode.from_tensor(layer.values)
        out = indexed_linear(inputs, columns, values, None, OUT)
    assert tuple(out.shape) == (2, 5, OUT) and out.dtype == torch.bfloat16


def test_the_operator_passes_torchs_schema_and_fake_checks():
    layer, _, bias = _layer(torch.float32)
    inputs = torch.randn(4, IN)
    torch.library.opcheck(
        indexed_linear,
        (inputs, layer.columns, layer.values, bias, OUT),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_the_operators_views_follow_the_parts_they_are_called_with():
    """The operator keeps numpy views of its parts on the values tensor; a call with other
    columns or another bias makes new ones, and a dropped layer's buffers are freed."""
    import copy
    import gc
    import weakref

    torch.manual_seed(0)
    weight = torch.randn(8, 16) * (torch.rand(8, 16) > 0.5)
    layer = IndexedLinear(weight, torch.randn(8))
    x = torch.randn(1, 16)
    expected = (x.double() @ weight.double().T + layer.bias.double()).float()
    got = indexed_linear(x, layer.columns, layer.values, layer.bias, 8)
    assert torch.allclose(got, expected, atol=1e-5)
    # the same values with its columns reversed: the product of the reversed rows
    shuffled = layer.columns.flip(1).contiguous()
    rows = torch.zeros(8, 16)  # the weight those parts stand for
    rows.scatter_(1, shuffled.long(), layer.values)
    again = indexed_linear(x, shuffled, layer.values, None, 8)
    assert torch.allclose(again, (x.double() @ rows.double().T).float(), atol=1e-5)
    # a deep copy carries copies of the views: its own are made, so a change to its values shows
    indexed_linear(x, layer.columns, layer.values, layer.bias, 8)
    twin = copy.deepcopy(layer)
    assert hasattr(twin.values, "_convergent_views")  # the copy's, made from the original's
    twin.values.zero_()
    assert torch.equal(indexed_linear(x, twin.columns, twin.values, twin.bias, 8)[0], twin.bias)
    values = weakref.ref(layer.values)
    del layer
    gc.collect()
    assert values() is None
