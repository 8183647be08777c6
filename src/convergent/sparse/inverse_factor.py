"""SparseGPT's factor of the damped ``H^-1``, computed in the Hessian's own memory.

SparseGPT needs the upper Cholesky factor ``U`` of ``(H + lambda I)^-1`` (``H^-1 = U^T U``),
which :func:`torch.linalg.cholesky_ex`, :func:`torch.cholesky_inverse` and ``cholesky_ex(...,
upper=True)`` compute from a copy of ``H``: a second ``[in, in]`` matrix (128 MiB for a
down projection of 4096 inputs in float64) beside the Hessian it came from. Where the caller
gives the Hessian up (its last reader, as the block-by-block driver does), this module runs
the same three LAPACK routines on the Hessian's memory instead, in the triangle torch would
have used, and keeps ``H`` in the other triangle until the factor is known to be good:

1. ``H``'s upper triangle (row-major; LAPACK's column-major lower) is mirrored into the lower,
   so the matrix is whole and symmetric;
2. ``?potrf('L')`` factors ``H + lambda I`` in the column-major lower triangle (as
   ``cholesky_ex`` does); the upper still holds ``H``;
3. ``?potri('L')`` turns the factor into ``H^-1``'s lower triangle (as ``cholesky_inverse``);
4. the two triangles swap places (an in-place transpose), so ``H^-1`` sits in the upper triangle,
   where ``cholesky_inverse``'s symmetric output had it, and ``H`` in the lower;
5. ``?potrf('U')`` factors it (as ``cholesky_ex(..., upper=True)``).

Each routine gets the same values in the same layout as torch gives it, from the same LAPACK
(the one linked into torch, found by its exported symbols), so the factor has the same bits
(tested against torch's sequence). A damping that fails at step 2 or 5 finds ``H`` intact in
the other triangle and is retried from it. Where torch exports no LAPACK (or the matrix is not
a CPU float32/float64 one), :func:`lapack` is None and the caller copies as before.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

SLAB = 128  # rows per step of the triangle copies (each step's temporary is [SLAB, in])

_ROUTINES = {torch.float64: ("dpotrf_", "dpotri_"), torch.float32: ("spotrf_", "spotri_")}


@functools.cache
def _library() -> Any:
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        library = ctypes.CDLL(str(path))
        for names in _ROUTINES.values():
            for name in names:
                getattr(library, name)
    except (OSError, AttributeError):  # another platform, or a torch without LAPACK symbols
        return None
    return library


def lapack(matrix: Tensor) -> Any:
    """torch's LAPACK where ``matrix`` can be factored in place by it (a contiguous square CPU
    float32 or float64 tensor), else None."""
    if (
        matrix.device.type != "cpu"
        or matrix.dtype not in _ROUTINES
        or matrix.ndim != 2
        or matrix.shape[0] != matrix.shape[1]
        or not matrix.is_contiguous()
    ):
        return None
    return _library()


def _call(routine: str, matrix: Tensor, uplo: bytes) -> int:
    """One LAPACK ``?potrf``/``?potri`` on ``matrix``'s memory read as column-major; its info."""
    name = _ROUTINES[matrix.dtype][0 if routine == "potrf" else 1]
    n = ctypes.c_int(matrix.shape[0])
    info = ctypes.c_int(0)
    function = getattr(_library(), name)
    function(
        ctypes.c_char_p(uplo),
        ctypes.byref(n),
        ctypes.c_void_p(matrix.data_ptr()),
        ctypes.byref(n),
        ctypes.byref(info),
    )
    return info.value


def mirror_upper_to_lower(rows: Tensor) -> None:
    """Copy the upper triangle of the square ``rows`` onto its strict lower one."""
    n = rows.shape[0]
    for start in range(0, n, SLAB):
        stop = min(start + SLAB, n)
        rows[start:stop, :start] = rows[:start, start:stop].T
        block = rows[start:stop, start:stop]
        block.copy_(block.triu() + block.triu(1).T)


def mirror_lower_to_upper(rows: Tensor) -> None:
    """Copy the lower triangle of the square ``rows`` onto its strict upper one."""
    mirror_upper_to_lower(rows.T)  # the transpose's upper triangle is this lower one


def swap_triangles(rows: Tensor) -> None:
    """Transpose the square ``rows`` in place (its strict triangles trade places)."""
    n = rows.shape[0]
    for start in range(0, n, SLAB):
        stop = min(start + SLAB, n)
        lower = rows[start:stop, :start]
        held = lower.clone()
        lower.copy_(rows[:start, start:stop].T)
        rows[:start, start:stop] = held.T
        block = rows[start:stop, start:stop]
        block.copy_(block.T.clone())


def upper_factor_finite(factor: Tensor, columns: int = 64) -> bool:
    """Whether the column-major ``factor``'s upper triangle (the diagonal included) is finite,
    a slab of columns at a time (the lower triangle holds the Hessian, not the factor)."""
    n = factor.shape[0]
    for start in range(0, n, columns):
        stop = min(start + columns, n)
        if not bool(torch.isfinite(factor[:start, start:stop]).all()):
            return False
        if not bool(torch.isfinite(factor[start:stop, start:stop].triu()).all()):
            return False
    return True


def factor_in_place(hessian: Tensor, damped_diagonal: Tensor) -> tuple[Tensor | None, str]:
    """Try one damping: the upper Cholesky factor of ``H^-1`` in ``hessian``'s memory.

    ``hessian`` is row-major with ``H`` in its upper triangle and, below, a mirror of it (made
    by :func:`mirror_upper_to_lower` before the first try). Returns ``(factor, "")``, the
    factor as a column-major view of ``hessian`` (its upper triangle; the lower holds ``H``),
    or ``(None, why)`` with ``H`` restored to both triangles (but the diagonal) for a retry.
    """
    factor = hessian.T  # column-major: LAPACK's lower triangle is the row-major upper one
    factor.diagonal().copy_(damped_diagonal)
    if _call("potrf", hessian, b"L") != 0:
        mirror_lower_to_upper(hessian)  # the row-major lower triangle still holds H
        return None, "not positive definite"
    _call("potri", hessian, b"L")  # H^-1's lower triangle
    swap_triangles(factor)  # H^-1 to the upper triangle, H to the lower
    if _call("potrf", hessian, b"U") != 0 or not upper_factor_finite(factor):
        mirror_upper_to_lower(hessian)  # the row-major upper triangle holds H now
        return None, "its inverse is not positive definite"
    return factor, ""
