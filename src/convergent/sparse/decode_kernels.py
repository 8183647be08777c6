"""A sparse linear layer for decoding: few rows of input, only the kept weights read.

    layer = IndexedLinear(weight, bias)          # weight [out, in], pruned; float32 or bfloat16
    y = layer(x)                                 # x [..., in] with few rows (1-16): y = x W^T + b

Token-by-token generation runs each linear layer on one row of input, and that is bound by
the bytes of weight read, not by arithmetic (docs/design.md, "Decoding a sparse model"). This
layout reads each kept weight once, as its value in the model's dtype (float32, or bfloat16
kept as its 16 bits) and its column as a ``uint16`` (``in_features <= 65,536``), row after
row (``row_starts`` marks where each row begins, so rows need not keep equal counts):

    y[t, r] = b[r] + sum over j in row r of values[j] * x[t, columns[j]]

The loop is compiled by numba (LLVM), with float reassociation allowed (``fastmath``) so
that the gathers are vectorized: sums run in another order than the dense GEMM's, so outputs
agree up to float rounding (bfloat16 values are widened to float32 and summed in float32).
One thread runs the rows in order; with more torch threads the rows are split among that
many numba threads. Where numba is not installed or fails to compile, nothing here is used:
:func:`decode_kernel_missing` says why, once, and the layer stays dense.
"""

from __future__ import annotations

from typing import Any

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


def _run(arrays: tuple[Any, ...], parallel: bool) -> None:
    from numba.core.errors import NumbaError

    try:
        from convergent.sparse.decode_loops import run

        row_starts, columns, values, x, out = arrays
        run(row_starts, columns, values, x, out, parallel=parallel)  # compiles on first call
    except (ImportError, NumbaError) as error:
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


class IndexedLinear(nn.Module):
    """y = x W^T + b with W stored as its kept values and their uint16 columns, row by row
    (module docstring). Inference only: the parts are buffers, not parameters.

    Args:
        weight: the dense ``[out, in]`` weight (already pruned), float32 or bfloat16, on the CPU.
        bias: ``[out]`` or None.

    Raises:
        ValueError: a weight the kernel cannot take (:func:`decode_kernel_reason`).
    """

    row_starts: Tensor
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
        starts = torch.zeros(self.out_features + 1, dtype=torch.int64)
        starts[1:] = kept.sum(dim=1).cumsum(0)
        columns = kept.nonzero()[:, 1]  # row-major order: row by row, columns ascending
        values = dense[kept]
        if dense.dtype == torch.bfloat16:
            values = values.view(torch.int16)  # its bits; widened to float32 in the kernel
        self.register_buffer("row_starts", starts, persistent=False)
        # uint16 columns (no sign to test in the loop); torch's uint16 has few ops, so the
        # bits are kept as int16 and viewed as uint16 by numpy
        self.register_buffer("columns", columns.to(torch.int32).to(torch.int16), persistent=False)
        self.register_buffer("values", values.contiguous(), persistent=False)
        self.register_buffer(
            "bias", None if bias is None else bias.detach().clone(), persistent=False
        )
        self._arrays = (
            self.row_starts.numpy(),
            self.columns.numpy().view("uint16"),
            self.values.numpy().view("uint16")
            if dense.dtype == torch.bfloat16
            else self.values.numpy(),
        )

    @property
    def stored_bytes(self) -> int:
        """Bytes of weight read per forward: values, columns and row starts."""
        return sum(part.numel() * part.element_size() for part in self._parts())

    def _parts(self) -> list[Tensor]:
        return [self.row_starts, self.columns, self.values]

    def forward(self, x: Tensor) -> Tensor:
        """``x`` ``[..., in]`` -> ``[..., out]`` in x's dtype."""
        rows = x.reshape(-1, self.in_features)
        # [in, tokens] float32: each kept weight reads its column's tokens side by side
        transposed = rows.detach().to(torch.float32).T.contiguous()
        out = torch.empty(self.out_features, rows.shape[0], dtype=torch.float32)
        parallel = _set_threads(torch.get_num_threads())
        _run((*self._arrays, transposed.numpy(), out.numpy()), parallel)
        result = out.T
        if self.bias is not None:
            result = result + self.bias.to(torch.float32)
        return result.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"layout={self.layout}, sparsity={self.sparsity:.3f}"
        )
