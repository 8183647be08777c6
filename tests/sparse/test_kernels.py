"""Sparse kernels: outputs equal dense within the stated tolerance, and the choice is the
timing's (a fake timer stands in for the clock, so no test depends on this machine's speed)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from convergent.models import Transformer, TransformerConfig
from convergent.sparse import prune_one_shot
from convergent.sparse.decode_kernels import IndexedLinear
from convergent.sparse.kernels import (
    OUTPUT_TOLERANCE,
    SparseLinear,
    fastest_speedup,
    to_sparse_kernels,
)


def _bound(inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The stated tolerance: OUTPUT_TOLERANCE x (|x| |W|^T), elementwise, in float64."""
    return OUTPUT_TOLERANCE * (inputs.double().abs() @ weight.double().abs().T) + 1e-30


def _pruned_weight(out: int, inputs: int, keep: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inputs, generator=generator)
    return weight * (torch.rand(out, inputs, generator=generator) < keep)


def _block_sparse(out: int, inputs: int, edge: int, keep: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    blocks = torch.rand(out // edge, inputs // edge, generator=generator) < keep
    mask = blocks.repeat_interleave(edge, 0).repeat_interleave(edge, 1)
    return torch.randn(out, inputs, generator=generator) * mask


@pytest.mark.parametrize(
    ("layout", "blocksize", "weight"),
    [
        ("csr", None, _pruned_weight(48, 64, 0.1)),
        ("csr", None, _pruned_weight(48, 64, 0.5)),
        ("bsr", 8, _block_sparse(48, 64, 8, 0.2)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_sparse_layer_computes_the_dense_layer_within_tolerance(layout, blocksize, weight, dtype):
    weight = weight.to(dtype)
    bias = torch.randn(48, dtype=dtype)
    inputs = torch.randn(3, 5, 64, dtype=dtype)  # [batch, tokens, in]
    expected = inputs @ weight.T + bias  # the dense reference, torch's own matmul
    for with_bias in (bias, None):
        layer = SparseLinear(weight, with_bias, layout, blocksize)
        got = layer(inputs)
        reference = expected if with_bias is not None else expected - bias
        assert got.shape == (3, 5, 48) and got.dtype == dtype
        assert bool(((got - reference).abs() <= _bound(inputs, weight)).all())


class _Timer:
    """Seconds per call as given: dense first, then each sparse layout tried."""

    def __init__(self, dense: float, sparse: float) -> None:
        self.dense, self.sparse = dense, sparse
        self.calls = 0

    def __call__(self, calls):
        self.calls += 1
        return [[self.dense] * 3] + [[self.sparse] * 3 for _ in calls[1:]]


class _LayoutTimer:
    """Seconds per call by the layout each call runs (``"dense"`` for the dense layer)."""

    def __init__(self, **seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, calls):
        layouts = [str(call.layout) for call in calls]
        return [[self.seconds[layout.split(" ")[0]]] * 3 for layout in layouts]


def _language_model() -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(task="lm", vocab_size=30, max_len=16, d_model=32, n_heads=4,
                               n_layers=2, d_ff=64, causal=True)  # fmt: skip
    model = Transformer(config)
    prune_one_shot(model, 0.9)
    return model.eval()


def test_a_faster_kernel_replaces_each_pruned_layer_and_the_logits_stay(caplog):
    model = _language_model()
    ids = torch.randint(0, 30, (2, 16))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    with caplog.at_level(logging.INFO, logger="convergent.sparse.kernels"):
        report = to_sparse_kernels(
            model, tokens=16, timer=_LayoutTimer(dense=2.0, csr=1.0, bsr=1.5, index16=1.5)
        )
    assert len(report.converted) == 12 and all(layer.speedup == 2.0 for layer in report.layers)
    assert isinstance(model.blocks[0].attention.q_proj, SparseLinear)
    assert isinstance(model.head, nn.Linear)  # not pruned: left as it is, unmentioned
    with torch.no_grad():
        got = model(input_ids=ids).logits
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert "blocks.0.attention.q_proj: csr, 2.00x as fast as dense at 90% sparse" in caplog.text


def test_a_slower_kernel_leaves_the_layer_dense_and_says_why(caplog):
    model = _language_model()
    with caplog.at_level(logging.INFO, logger="convergent.sparse.kernels"):
        report = to_sparse_kernels(model, tokens=4, timer=_Timer(1.0, 1.6))
    assert not report.converted
    assert isinstance(model.blocks[0].attention.q_proj, nn.Linear)
    assert "blocks.1.feed_forward.down_proj: dense: the sparse kernel took 1.6x as long at 90%" in (
        caplog.text
    )


def test_a_layer_switches_only_where_it_gains_the_margin():
    # dense 1.2 s against sparse 1.0 s: a 1.2x gain per layer, under the 1.25x a layer must
    # gain (per-layer gains this small came to less than dense for a whole model)
    small = to_sparse_kernels(_language_model(), tokens=4, timer=_Timer(1.2, 1.0))
    assert not small.converted
    assert small.layers[0].reason == (
        "dense: the sparse kernel gained only 1.20x at 90%, under the 1.25x a layer must gain "
        "to switch"
    )
    # 1.3x clears it
    assert to_sparse_kernels(_language_model(), tokens=4, timer=_Timer(1.3, 1.0)).converted


def test_where_the_decode_kernel_reads_few_fewer_bytes_a_layer_must_gain_more():
    # Per-row uniform masks (Wanda's shape): ELL reads a value plus a 2-byte column per kept
    # weight. float32 at 50 %: 4 / (0.5 x 6) = 1.33x fewer bytes; at 70 %: 2.22x. bfloat16 at
    # 50 %: 2 / (0.5 x 4) = 1.0x, no fewer.
    def layer(keep: int, dtype: torch.dtype = torch.float32) -> nn.Sequential:
        weight = torch.zeros(64, 128)
        for row in range(64):
            weight[row, torch.randperm(128)[:keep]] = torch.randn(keep)
        linear = nn.Linear(128, 64, bias=False)
        linear.weight.data = weight
        return nn.Sequential(linear).to(dtype).eval()

    clear = _LayoutTimer(dense=2.0, index16=1.0, csr=3.0, bsr=3.0)  # 2.0x
    small = _LayoutTimer(dense=1.4, index16=1.0, csr=3.0, bsr=3.0)  # 1.4x: 1.25 <= it < 1.5
    assert [c.kernel for c in to_sparse_kernels(layer(64), tokens=1, timer=clear).converted] == [
        "index16"
    ]
    half = to_sparse_kernels(layer(64), tokens=1, timer=small)
    assert not half.converted and half.layers[0].reason == (
        "dense: the sparse kernel gained only 1.40x at 50%, under the 1.5x a layer must gain to"
        " switch where the decode kernel reads less than 1.5x fewer bytes"
    )
    seventy = to_sparse_kernels(layer(38), tokens=1, timer=small)
    assert [c.kernel for c in seventy.converted] == ["index16"]
    bfloat16 = to_sparse_kernels(layer(64, torch.bfloat16), tokens=1, timer=clear)
    assert not bfloat16.converted
    assert any("decode kernel reads no fewer bytes than dense" in r for r in bfloat16.unavailable)


def test_layers_below_the_least_sparsity_are_not_timed():
    model = _language_model()
    timer = _Timer(2.0, 1.0)
    report = to_sparse_kernels(model, min_sparsity=0.95, timer=timer)
    assert timer.calls == 0 and not report.converted
    assert (
        report.layers[0].reason
        == "dense: 90% sparse, below the 95% at which a sparse kernel is tried"
    )


def test_a_dtype_the_device_lacks_stays_dense_logged_once(caplog):
    model = _language_model().to(torch.float16)
    with caplog.at_level(logging.INFO, logger="convergent.sparse.kernels"):
        report = to_sparse_kernels(model, timer=_Timer(2.0, 1.0))
    assert not report.converted
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "no sparse kernel for float16" in warnings[0].message and "(12 layer(s))" in (
        warnings[0].message
    )


@pytest.mark.parametrize("fastest", ["index16", "csr"])
def test_the_fastest_layout_by_the_timer_replaces_the_layer(fastest):
    model = _language_model()
    ids = torch.randint(0, 30, (1, 16))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    seconds = {"dense": 3.0, "csr": 2.0, "bsr": 2.5, "index16": 2.0}
    seconds[fastest] = 1.0
    report = to_sparse_kernels(model, tokens=1, timer=_LayoutTimer(**seconds))
    assert {layer.kernel for layer in report.layers} == {fastest}
    assert all(layer.speedup == 3.0 for layer in report.layers)
    kind = IndexedLinear if fastest == "index16" else SparseLinear
    assert isinstance(model.blocks[1].feed_forward.down_proj, kind)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)


def test_bfloat16_layers_run_on_the_decode_kernel():
    model = _language_model().to(torch.bfloat16)
    report = to_sparse_kernels(model, tokens=1, timer=_LayoutTimer(dense=2.0, index16=1.0))
    assert len(report.converted) == 12 and not report.unavailable
    assert isinstance(model.blocks[0].attention.q_proj, IndexedLinear)


def test_without_numba_the_layers_keep_csr_or_stay_dense_said_once(monkeypatch, caplog):
    import convergent.sparse.decode_kernels as decode

    monkeypatch.setattr(
        decode,
        "_FAILURES",
        [
            "dense: the decode kernel needs numba, which does"
            " not import here (no numba); pip install numba"
        ],
    )
    for dtype, converted in ((torch.float32, 12), (torch.bfloat16, 0)):
        caplog.clear()
        model = _language_model().to(dtype)
        with caplog.at_level(logging.INFO, logger="convergent.sparse.kernels"):
            report = to_sparse_kernels(model, timer=_LayoutTimer(dense=2.0, csr=1.0, bsr=1.0))
        assert len(report.converted) == converted
        warnings = [
            record.message for record in caplog.records if record.levelno >= logging.WARNING
        ]
        assert len(warnings) == 1 and "pip install numba (12 layer(s))" in warnings[0]


def test_training_mode_is_refused_with_the_reason():
    model = _language_model().train()
    with pytest.raises(ValueError, match=r"needs a model in eval mode.*training through them"):
        to_sparse_kernels(model)


def test_gpt2_conv1d_layers_convert_and_tied_weights_stay():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16,
                                       vocab_size=40)).eval()  # fmt: skip
    prune_one_shot(model, 0.8)
    ids = torch.randint(0, 40, (1, 16))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    report = to_sparse_kernels(model, timer=_Timer(2.0, 1.0))
    assert {layer.name for layer in report.converted} == {
        "transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj",
        "transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj",
    }  # fmt: skip
    assert model.lm_head.weight is model.transformer.wte.weight
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)


def test_the_speedup_compares_the_fastest_samples():
    # Samples another process slowed (9.0, 10.0) do not count; the fastest of each do.
    assert fastest_speedup([1.0, 1.2, 9.0], [10.0, 0.5, 0.6]) == 2.0


def _uneven_weight(out: int, inputs: int, keep: float) -> torch.Tensor:
    """A pruned weight whose rows keep different counts: one row empty, one row full."""
    weight = _pruned_weight(out, inputs, keep)
    weight[1] = 0.0
    weight[2] = torch.randn(inputs)
    return weight


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tokens", [1, 5, 16])
def test_the_decode_kernel_computes_the_dense_layer_within_tolerance(tokens, threads):
    weight = _uneven_weight(40, 72, 0.3)
    bias = torch.randn(40)
    inputs = torch.randn(tokens, 72)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for with_bias in (bias, None):
            dense = nn.functional.linear(inputs, weight, with_bias)  # the dense layer
            got = IndexedLinear(weight, with_bias)(inputs.view(1, tokens, 72))
            assert got.shape == (1, tokens, 40) and got.dtype == torch.float32
            assert bool(((got[0] - dense).abs() <= _bound(inputs, weight)).all())
    finally:
        torch.set_num_threads(before)


def test_the_decode_kernel_reads_columns_past_32768_and_bfloat16_values():
    weight = torch.zeros(3, 40_000)
    weight[0, [5, 32_767, 32_768, 39_999]] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    weight[2, 35_000] = -1.5
    inputs = torch.randn(2, 40_000)
    for dtype in (torch.float32, torch.bfloat16):
        low = weight.to(dtype)
        got = IndexedLinear(low, None)(inputs.to(dtype)).double()
        exact = inputs.to(dtype).double() @ low.double().T
        # bfloat16: the float32 sum rounded once to bfloat16 (8 significant bits)
        tolerance = 2**-8 * exact.abs() if dtype == torch.bfloat16 else _bound(inputs, weight)
        assert bool(((got - exact).abs() <= tolerance + 1e-30).all()), dtype


def test_the_decode_kernel_refuses_what_it_cannot_take():
    with pytest.raises(ValueError, match="takes float32 or bfloat16, not float64"):
        IndexedLinear(torch.ones(2, 2, dtype=torch.float64), None)
    with pytest.raises(ValueError, match="70000 inputs exceed the decode kernel's 65536"):
        IndexedLinear(torch.ones(1, 70_000), None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_token_with_bias_in_either_dtype_computes_the_dense_layer(dtype):
    weight = _uneven_weight(40, 72, 0.3).to(dtype)
    bias = torch.randn(40).to(dtype)
    token = torch.randn(72, 1).to(dtype).T  # [1, 72], not contiguous; a leaf asking for grad
    token.requires_grad_(True)
    got = IndexedLinear(weight, bias)(token)
    # the float32 sum of the stored values, bias added before one rounding to ``dtype``
    exact = token.detach().double() @ weight.double().T + bias.double()
    assert got.shape == (1, 40) and got.dtype == dtype
    if dtype == torch.bfloat16:
        tolerance = 2**-8 * exact.abs() + _bound(token.detach().float(), weight.float())
    else:
        tolerance = _bound(token.detach(), weight)
    assert bool(((got.double() - exact).abs() <= tolerance).all())
