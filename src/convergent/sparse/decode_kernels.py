"""A sparse linear layer for decoding: few rows of input, only the kept weights read.

    layer = IndexedLinear(weight, bias)          # weight [out, in], pruned; float32 or bfloat16
    y = layer(x)                                 # x [..., in] with few rows (1-16): y = x W^T + b

Token-by-token generation runs each linear layer on one row of input, and that is bound by
the bytes of weight read, not by arithmetic (docs/design.md, "Decoding a sparse model"). This
layout (ELL) reads each kept weight once, as its value in the model's dtype (float32, or
bfloat16 kept as its 16 bits) and its column as a ``uint16`` (``in_features <= 65,536``);
every row holds ``kept`` slots, the most any row keeps, the shorter rows padded with zeros
(none where the mask keeps the same count in every row, as Wanda's and N:M masks do):

    y[t, r] = b[r] + sum over j < kept of values[r, j] * x[t, columns[r, j]]

The loop is compiled by numba (LLVM), with float reassociation allowed (``fastmath``) so
that the gathers are vectorized: sums run in another order than the dense GEMM's, so outputs
agree up to float rounding (bfloat16 values are widened to float32 and summed in float32).
One thread runs the rows in order; with more torch threads the rows are split among that
many numba threads. Where numba is not installed or fails to compile, nothing here is used:
:func:`decode_kernel_missing` says why, once, and the layer stays dense.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy
import torch
from torch import Tensor, nn

DECODE_DTYPES = (torch.float32, torch.bfloat16)
MAX_COLUMNS = 1 << 16  # a column index is a uint16
LAYOUT = "index16"


_FAILURES: list[str] = []  # a compiler failure, said once and then for every layer


def decode_kernel_missing() -> str | None:
    """Why this machine has no decode kernel (numba missing, or its compiler failed), or None."""
    if _FAILURES:
        return _FAILURES[0]
    try:
        import numba  # noqa: F401
    except Exception as error:
        _FAILURES.append(
            f"dense: the decode kernel needs numba, which does not import here ({error}); "
            "pip install numba"
        )
        return _FAILURES[0]
    return None


def decode_kernel_reason(weight: Tensor) -> str | None:
    """Why ``weight`` cannot run on the decode kernel, or None."""
    missing = decode_kernel_missing()
    if missing is not None:
        return missing
    if weight.device.type != "cpu":
        return f"dense: the decode kernel runs on the CPU, not {weight.device.type}"
    if weight.dtype not in DECODE_DTYPES:
        return (
            f"dense: the decode kernel takes float32 or bfloat16, not "
            f"{str(weight.dtype).removeprefix('torch.')}"
        )
    if weight.shape[1] > MAX_COLUMNS:
        return f"dense: {weight.shape[1]} inputs exceed the decode kernel's {MAX_COLUMNS}"
    return None


def decode_bytes_gain(weight: Tensor) -> float:
    """Dense bytes over the decode kernel's for ``weight``: each row padded to the fullest
    row's kept count, a value in the weight's dtype plus a 2-byte column per slot; the limit of
    its speed-up where weights stream from memory."""
    slots = int((weight != 0).sum(dim=1).max()) if weight.numel() else 0
    size = weight.element_size()
    return weight.shape[1] * size / (slots * (size + 2)) if slots else math.inf


_LOOPS: list[Any] = []  # (run, NumbaError) once imported: a forward pays no import


def _run(columns: Any, values: Any, x: Any, out: Any, parallel: bool) -> None:
    if not _LOOPS:
        from numba.core.errors import NumbaError

        from convergent.sparse.decode_loops import run

        _LOOPS.extend((run, NumbaError))
    run, numba_error = _LOOPS
    try:
        run(columns, values, x, out, parallel=parallel)  # compiles on a first call
    except numba_error as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        _FAILURES.append(f"dense: the decode kernel does not compile here ({first})")
        raise RuntimeError(_FAILURES[-1].removeprefix("dense: ")) from error


def _set_threads(threads: int) -> bool:
    """Run numba's parallel loops on ``threads`` threads; False where one thread is asked."""
    if threads <= 1:
        return False
    import numba

    wanted = min(threads, int(numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    if numba.get_num_threads() != wanted:
        numba.set_num_threads(wanted)
    return wanted > 1


def _product(x: Tensor, columns: Any, values: Any, bias: Any, out_features: int) -> Tensor:
    """``x W^T + b`` from the numpy views of an :class:`IndexedLinear`'s parts (columns as
    uint16, values as float32 or bfloat16's uint16 bits, bias as float32 or None)."""
    threads = torch.get_num_threads()
    parallel = threads > 1 and _set_threads(threads)
    in_features = x.shape[-1]
    if x.numel() == in_features:
        # one token, the decoding step: the output made and biased in numpy (a 16 x 16
        # layer's call, module included: 9.5 us with a bias, 18.8 before; nn.Linear 14)
        source = x if x.dtype == torch.float32 else x.to(torch.float32)
        if source.requires_grad:
            source = source.detach()
        target = numpy.empty(out_features, numpy.float32)
        _run(columns, values, source.numpy().reshape(-1), target, parallel)
        if bias is not None:
            target += bias  # before rounding to x's dtype
        out = torch.from_numpy(target).view(*x.shape[:-1], out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    # [in, tokens] float32: each kept weight reads its column's tokens side by side
    source = x.detach().reshape(-1, in_features).to(torch.float32).T.contiguous()
    result = torch.empty(out_features, source.shape[1], dtype=torch.float32)
    _run(columns, values, source.numpy(), result.numpy(), parallel)
    if bias is not None:
        result.numpy()[:] += bias[:, None]
    return result.T.to(x.dtype).reshape(*x.shape[:-1], out_features)


def _indexed_linear(
    x: Tensor, columns: Tensor, values: Tensor, bias: Tensor | None, out_features: int
) -> Tensor:
    # numpy views of the parts, made once per buffer and kept on the values tensor (5 us a
    # call here, a third of the operator's call), checked against the columns and bias they
    # were made with and the memory of the values (a deep copy of the tensor carries copies of
    # the views, not views of its own memory); a cycle through the views' bases, which the
    # collector frees
    held: tuple[Tensor, Tensor | None, int, tuple[Any, Any, Any]] | None
    held = getattr(values, "_convergent_views", None)
    address = values.data_ptr()
    if held is None or held[0] is not columns or held[1] is not bias or held[2] != address:
        held = (columns, bias, address, _arrays(columns, values, bias))
        values._convergent_views = held  # type: ignore[attr-defined]
    column_array, value_array, bias_array = held[3]
    return _product(x, column_array, value_array, bias_array, out_features).contiguous()


def _indexed_linear_shape(
    x: Tensor, columns: Tensor, values: Tensor, bias: Tensor | None, out_features: int
) -> Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


# IndexedLinear's product as one operator, for torch.compile: numba's loop is opaque to dynamo,
# so the graph calls it whole, its output's shape from the fake. Defined on a Library, not by
# torch.library.custom_op: that wraps the call in Python dispatch costing 61 us against 27
# here (a 16 x 16 layer, one token; eager 12), 56 times a decoding step.
_LIBRARY = torch.library.Library("convergent", "FRAGMENT")
_LIBRARY.define(
    "indexed_linear(Tensor x, Tensor columns, Tensor values, Tensor? bias, int out_features)"
    " -> Tensor"
)
_LIBRARY.impl("indexed_linear", _indexed_linear, "CPU")
torch.library.register_fake("convergent::indexed_linear", _indexed_linear_shape, lib=_LIBRARY)
indexed_linear = torch.ops.convergent.indexed_linear.default
"""``indexed_linear(x, columns, values, bias, out_features)``: ``x`` ``[..., in]`` ->
``[..., out]``; columns ``[out, kept]`` int16 (the uint16 columns' bits), values float32 or
int16 (bfloat16's bits), bias ``[out]`` or None (:class:`IndexedLinear`'s buffers)."""


def _arrays(columns: Tensor, values: Tensor, bias: Tensor | None) -> tuple[Any, Any, Any]:
    """numpy views of the parts (:func:`_product`'s arguments); int16 values are bfloat16's."""
    value_array = values.numpy()
    if values.dtype == torch.int16:
        value_array = value_array.view("uint16")
    bias_array = None if bias is None else bias.to(torch.float32).numpy()
    return columns.numpy().view("uint16"), value_array, bias_array


class IndexedLinear(nn.Module):
    """y = x W^T + b with W stored as its kept values and their uint16 columns, row by row
    (module docstring). Inference only: the parts are buffers, not parameters.

    Args:
        weight: the dense ``[out, in]`` weight (already pruned), float32 or bfloat16, on the CPU.
        bias: ``[out]`` or None.

    Raises:
        ValueError: a weight the kernel cannot take (:func:`decode_kernel_reason`).
    """

    columns: Tensor
    values: Tensor
    bias: Tensor | None

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        reason = decode_kernel_reason(weight)
        if reason is not None:
            raise ValueError(reason.removeprefix("dense: "))
        dense = weight.detach()
        self.out_features, self.in_features = (int(size) for size in dense.shape)
        self.dtype = dense.dtype
        self.layout = LAYOUT
        kept = dense != 0
        self.sparsity = 1.0 - float(kept.float().mean())
        slots = int(kept.sum(dim=1).max()) if dense.numel() else 0
        # each row's kept columns first, ascending, then its zeros (padding: value 0)
        order = torch.sort((~kept).to(torch.uint8), dim=1, stable=True).indices[:, :slots]
        values = dense.gather(1, order).contiguous()
        if dense.dtype == torch.bfloat16:
            values = values.view(torch.int16)  # its bits; widened to float32 in the kernel
        # uint16 columns: no sign for numba to test on every read (int16 ran 0.5x as fast).
        # torch's uint16 has few ops, so the bits are kept as int16 and viewed by numpy.
        self.register_buffer("columns", order.to(torch.int32).to(torch.int16), persistent=False)
        self.register_buffer("values", values, persistent=False)
        self.register_buffer(
            "bias", None if bias is None else bias.detach().clone(), persistent=False
        )
        self._arrays = self._views()

    def _views(self) -> tuple[Any, Any, Any]:
        """numpy views of the parts (:func:`_arrays`), made once: each ``.numpy()`` costs
        ~1 us a forward, a torch add on the output ~6 us against numpy's ~1."""
        return _arrays(self.columns, self.values, self.bias)

    def __deepcopy__(self, memo: dict[int, Any]) -> IndexedLinear:
        clone = IndexedLinear.__new__(IndexedLinear)
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            if key != "_arrays":  # views of this module's buffers, not of the copy's
                clone.__dict__[key] = copy.deepcopy(value, memo)
        clone._arrays = clone._views()
        return clone

    def _apply(self, fn: Any, recurse: bool = True) -> IndexedLinear:
        super()._apply(fn, recurse)
        self._arrays = self._views()  # the buffers may be new tensors
        return self

    @property
    def stored_bytes(self) -> int:
        """Bytes of weight read per forward: values and columns, padding included."""
        return sum(part.numel() * part.element_size() for part in (self.columns, self.values))

    def forward(self, x: Tensor) -> Tensor:
        """``x`` ``[..., in]`` -> ``[..., out]`` in x's dtype."""
        if torch.compiler.is_compiling():  # one node of the graph: no break (module docstring)
            return indexed_linear(x, self.columns, self.values, self.bias, self.out_features)
        return _product(x, *self._arrays, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"layout={self.layout}, sparsity={self.sparsity:.3f}"
        )
