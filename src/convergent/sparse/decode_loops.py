"""The decode kernel's compiled loops (numba), imported only when a kernel first runs.

Each loop computes ``out[row, t] = sum_j widen(values[row, j]) * x[columns[row, j], t]`` over
the ``kept`` slots of each row (ELL: every row holds as many, padded with zeros); ``widen`` is
the identity on float32 values and turns bfloat16 bits (uint16) into the float32 they stand
for. Measured here (2816 x 1024 at 50 %, one token, one thread): this 2-D loop ran in 573 us,
the same loop over ragged rows (a start offset per row, as CSR) in 1308 us.
The parallel twins split the rows among numba's threads. numba compiles one version per
value type and caches it on disk (``cache=True``), so a new process reuses it.
"""

# mypy: ignore-errors
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import types
from numba.extending import intrinsic, overload


@intrinsic
def _bfloat16_bits_to_float32(typing_context, bits):
    def codegen(context, builder, signature, arguments):
        wide = builder.shl(builder.zext(arguments[0], ir.IntType(32)), ir.IntType(32)(16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(types.uint16), codegen


def widen(value):
    """A value as float32 (a stand-in that numba replaces by the overload below)."""
    return value


@overload(widen)
def _widen(value):
    if value == types.uint16:
        return lambda value: _bfloat16_bits_to_float32(value)
    return lambda value: value


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=True)
def one_token(columns, values, x, out):
    rows, kept = values.shape
    for row in range(rows):
        total = numba.float32(0.0)
        for j in range(kept):
            total += widen(values[row, j]) * x[columns[row, j]]
        out[row] = total


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=True, parallel=True)
def one_token_parallel(columns, values, x, out):
    rows, kept = values.shape
    for row in prange(rows):
        total = numba.float32(0.0)
        for j in range(kept):
            total += widen(values[row, j]) * x[columns[row, j]]
        out[row] = total


# Few tokens: each kept weight times its column's tokens, side by side (x is [in, tokens]),
# summed in a local array: summed into ``out[row, t]``, which LLVM cannot prove apart from
# ``x``, a [32, 1024] x 2816 layer at 50 % took 2x dense's time; so, 1.3x.
@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=True)
def few_tokens(columns, values, x, out):
    rows, kept = values.shape
    tokens = x.shape[1]
    total = np.zeros(tokens, np.float32)
    for row in range(rows):
        total[:] = 0.0
        for j in range(kept):
            value = widen(values[row, j])
            column = columns[row, j]
            for t in range(tokens):
                total[t] += value * x[column, t]
        out[row, :] = total


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=True, parallel=True)
def few_tokens_parallel(columns, values, x, out):
    rows, kept = values.shape
    tokens = x.shape[1]
    for row in prange(rows):
        total = np.zeros(tokens, np.float32)  # one per row: the threads share none
        for j in range(kept):
            value = widen(values[row, j])
            column = columns[row, j]
            for t in range(tokens):
                total[t] += value * x[column, t]
        out[row, :] = total


def run(columns, values, x, out, parallel: bool) -> None:
    """The loop for ``x``: one token (``x`` ``[in]``, ``out`` ``[out]``) or few (``x``
    ``[in, tokens]``, ``out`` ``[out, tokens]``), serial or parallel."""
    if x.ndim == 1:
        (one_token_parallel if parallel else one_token)(columns, values, x, out)
    else:
        (few_tokens_parallel if parallel else few_tokens)(columns, values, x, out)
