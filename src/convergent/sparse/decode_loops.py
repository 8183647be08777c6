"""The decode kernel's compiled loops (numba), imported only when a kernel first runs.

Each loop computes ``out[row, t] = sum_j widen(values[j]) * x[columns[j], t]`` over the kept
weights ``j`` of each row (``row_starts[row] <= j < row_starts[row + 1]``); ``widen`` is the
identity on float32 values and turns bfloat16 bits (uint16) into the float32 they stand for.
The parallel twins split the rows among numba's threads. numba compiles one version per
value type and caches it on disk (``cache=True``), so a new process reuses it.
"""

# mypy: ignore-errors
from __future__ import annotations

import numba
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
def one_token(row_starts, columns, values, x, out):
    for row in range(row_starts.shape[0] - 1):
        total = numba.float32(0.0)
        for j in range(row_starts[row], row_starts[row + 1]):
            total += widen(values[j]) * x[columns[j], 0]
        out[row, 0] = total


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=True, parallel=True)
def one_token_parallel(row_starts, columns, values, x, out):
    for row in prange(row_starts.shape[0] - 1):
        total = numba.float32(0.0)
        for j in range(row_starts[row], row_starts[row + 1]):
            total += widen(values[j]) * x[columns[j], 0]
        out[row, 0] = total


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=True)
def few_tokens(row_starts, columns, values, x, out):
    tokens = x.shape[1]
    for row in range(row_starts.shape[0] - 1):
        for t in range(tokens):
            out[row, t] = 0.0
        for j in range(row_starts[row], row_starts[row + 1]):
            value = widen(values[j])
            column = columns[j]
            for t in range(tokens):
                out[row, t] += value * x[column, t]


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=True, parallel=True)
def few_tokens_parallel(row_starts, columns, values, x, out):
    tokens = x.shape[1]
    for row in prange(row_starts.shape[0] - 1):
        for t in range(tokens):
            out[row, t] = 0.0
        for j in range(row_starts[row], row_starts[row + 1]):
            value = widen(values[j])
            column = columns[j]
            for t in range(tokens):
                out[row, t] += value * x[column, t]


def run(row_starts, columns, values, x, out, parallel: bool) -> None:
    """The loop for ``x``'s token count (``x`` is ``[in, tokens]``), serial or parallel."""
    if x.shape[1] == 1:
        (one_token_parallel if parallel else one_token)(row_starts, columns, values, x, out)
    else:
        (few_tokens_parallel if parallel else few_tokens)(row_starts, columns, values, x, out)
