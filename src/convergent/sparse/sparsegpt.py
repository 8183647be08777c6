"""SparseGPT: one-shot pruning with optimal-brain-surgeon updates of the remaining weights.

Frantar and Alistarh, "SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot"
(ICML 2023, arXiv:2301.00774). For a linear layer with weight ``W`` [out, in] and calibration
inputs ``X`` [tokens, in], ``H = X^T X`` is the Hessian of the layer's squared reconstruction
error. Inputs never seen (``H_jj = 0``) get ``H_jj = 1`` and ``W[:, j] = 0``; then
``H += lambda I`` with ``lambda = damping * mean(diag H)``, and ``U`` is the upper Cholesky factor
of ``H^-1`` (``H^-1 = U^T U``; ``U_ii^2`` is ``[H_F^-1]_ii`` for the columns ``F = i..in-1``
not yet processed).

Columns are processed left to right and frozen once processed. Update rule, column i::

    q = W[:, i] where kept, else 0;   err = (W[:, i] - q) / U_ii
    W[:, i] = q;                      W[:, j] -= err * U_ij   for the later columns j

The mask is chosen by the saliency ``W_ij^2 / U_jj^2`` on the current weights. Unstructured, as
the authors' code does it: at the start of every block of ``B = block_size`` columns, the block
is thresholded over all of its rows at once (the entries at or below the ``int(sparsity * out *
B)``-th lowest score, counted from 0, are pruned; at sparsity 0 none are); ``per_row=True``
instead prunes the lowest ``round(sparsity * B)`` of each row of the block (this library before
issue 48). N:M: the N highest of every M columns are kept when the group's first column is
reached. Inside a block the update is applied column by column; the block's errors reach the
later blocks in one product ``W[:, later] -= Err @ U[block, later]``, which is the same
arithmetic, reordered.

The Hessian, its inverse and the Cholesky factor are computed in float64; the column loop runs
in float32 for float32, bfloat16 and float16 weights, as the authors' code and llm-compressor
do (in float64 it took 1.0-1.6x as long on a CPU: benchmarks/sparsegpt_update_dtype.py), and
in float64 for float64 weights; ``float64_updates=True`` runs it in float64 whatever the
weights' dtype.

When the damped Hessian is not positive definite (a real model's dead or collinear inputs),
the damping is raised tenfold, up to three times, each retry logged; then the layer is refused
with one sentence. Non-finite weights are never returned.

:class:`SparseGPT` is the same method behind the calibrated-pruner interface
(:mod:`convergent.sparse.pruners`) that the block-by-block driver runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from convergent.sparse.inverse_factor import factor_in_place, lapack, mirror_upper_to_lower
from convergent.sparse.masks import check_sparsity
from convergent.sparse.spec import STATISTICS_DTYPES, check_n_m_fits, check_statistics
from convergent.sparse.topk import count_to_prune, keep_largest_in_groups

logger = logging.getLogger(__name__)

# Retries of a failed Cholesky factorization, each at ten times the previous damping.
DAMPING_RETRIES = 3
# Rows of the later columns' update per product (each entry is the same dot product over the
# block's columns whatever the number of rows, so the bits do not move; the whole [out, later]
# product was a 24 MiB temporary at a 1536 x 4096 float32 weight).
UPDATE_ROWS = 256
# Rows of X^T X per product when it is accumulated (add_hessian_upper): a [128, in] scratch.
HESSIAN_ROWS = 128


def hessian(inputs: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """``X^T X`` over the tokens of one batch ([in, in]); batches add up.

    Args:
        inputs: calibration inputs [..., in] (every leading dimension counts as tokens).
        dtype: the dtype it is computed and summed in (:data:`STATISTICS_DTYPES`).
    """
    if inputs.ndim < 1:
        raise ValueError("inputs must have a feature dimension (ndim >= 1), got a 0-d tensor")
    features = inputs.detach().reshape(-1, inputs.shape[-1]).to(dtype)
    return features.T @ features


def add_hessian_upper(
    inputs: Tensor, dtype: torch.dtype = torch.float64, total: Tensor | None = None
) -> Tensor:
    """``X^T X``'s upper triangle (the diagonal included) over one batch's tokens, added into
    ``total`` in place: the statistic :class:`SparseGPT` sums, which
    :func:`sparsegpt_prune` reads the upper triangle of.

    The product is taken :data:`HESSIAN_ROWS` rows at a time, each from the diagonal on
    (``X[:, rows]^T X[:, rows.start:]``), into a small scratch that is then added: no second
    ``[in, in]`` matrix, and about half of ``X^T X``'s multiplications. Each entry is the same
    dot product over the tokens as in ``X^T X``, added once, so the sum has the bits of ``total
    + X^T X`` where BLAS computes every entry in token order whatever the product's shape (MKL
    on a CPU does; tested). Below the diagonal, only the entries inside each slab's diagonal
    block are added (the rest stay as they were): only the upper triangle is the sum.

    Args:
        inputs: calibration inputs [..., in].
        dtype: the dtype it is computed and summed in.
        total: the earlier batches' sum, [in, in] in ``dtype``; None: a new zero matrix.
    """
    if inputs.ndim < 1:
        raise ValueError("inputs must have a feature dimension (ndim >= 1), got a 0-d tensor")
    features = inputs.detach().reshape(-1, inputs.shape[-1]).to(dtype)
    columns = features.shape[1]
    if total is None:
        total = features.new_zeros(columns, columns)
    elif total.shape != (columns, columns) or total.dtype != dtype:
        raise ValueError(
            f"total must be a ({columns}, {columns}) {dtype} matrix to add this batch into,"
            f" got {tuple(total.shape)} {total.dtype}"
        )
    scratch = features.new_empty(min(HESSIAN_ROWS, columns) * columns)
    for start in range(0, columns, HESSIAN_ROWS):
        stop = min(start + HESSIAN_ROWS, columns)
        product = scratch[: (stop - start) * (columns - start)].view(stop - start, -1)
        torch.mm(features[:, start:stop].T, features[:, start:], out=product)
        total[start:stop, start:] += product
    return total


def sparsegpt_prune(
    weight: Tensor,
    hessian: Tensor,
    sparsity: float,
    pattern: str | tuple[int, int] | None = None,
    block_size: int = 128,
    damping: float = 0.01,
    per_row: bool = False,
    float64_updates: bool = False,
    statistics_dtype: torch.dtype = torch.float64,
    overwrite_hessian: bool = False,
) -> tuple[Tensor, Tensor]:
    """Prune one weight matrix with SparseGPT (see the module docstring for the update rule).

    Args:
        weight: the layer's weight [out, in].
        hessian: ``X^T X`` summed over the calibration tokens, [in, in] (see :func:`hessian`);
            only its upper triangle, the diagonal included, is read (as
            :func:`add_hessian_upper` sums it).
        sparsity: the fraction of every block to prune, in [0, 1) (checked but not used for
            N:M, which prunes 1 - N/M).
        pattern: ``"unstructured"`` or None, or ``"N:M"`` / ``(N, M)`` (e.g. ``"2:4"``); N:M
            needs M to divide both ``in`` and ``block_size``.
        block_size: columns per block (the unstructured mask is chosen once per block).
        damping: ``lambda / mean(diag H)``, >= 0 (raised tenfold, up to three times, while the
            damped Hessian is not positive definite).
        per_row: choose the unstructured mask per row of each block (the same count in every
            row) instead of over the whole block, as the authors do.
        float64_updates: run the column loop in float64 whatever the weights' dtype (this
            library before issue 48); False: in the wider of float32 and the weights' dtype.
        statistics_dtype: the dtype of the damped Hessian's factorizations (float64, or
            float32 as the authors' code and llm-compressor do).
        overwrite_hessian: factor in ``hessian``'s own memory (a CPU Hessian in
            ``statistics_dtype``; elsewhere it is copied as usual), leaving it unusable, and
            update ``weight`` in its own memory where it is contiguous and in the loop's dtype
            (the returned weight is then ``weight``): for a caller that reads neither again.
            The same bits, one ``[in, in]`` and one ``[out, in]`` matrix fewer.

    Returns:
        ``(new_weight, keep_mask)``: the pruned and updated weight in ``weight``'s dtype (pruned
        entries exactly 0, as are the columns of inputs never seen) and the bool mask.
    """
    check_sparsity(sparsity)
    if weight.ndim != 2:
        raise ValueError(f"weight must be [out, in] (2-D), got shape {tuple(weight.shape)}")
    columns = weight.shape[1]
    if hessian.shape != (columns, columns):
        raise ValueError(
            f"hessian must have shape ({columns}, {columns}) to match the weight's inputs,"
            f" got {tuple(hessian.shape)}"
        )
    shape = check_n_m_fits(pattern, columns)
    if not (isinstance(block_size, int) and block_size >= 1):
        raise ValueError(f"block_size must be an integer >= 1, got {block_size}")
    if shape is not None and block_size % shape[1] != 0:
        raise ValueError(
            f"block_size must be a multiple of M = {shape[1]} for pattern {pattern!r},"
            f" got {block_size}"
        )
    if not (math.isfinite(damping) and damping >= 0):
        raise ValueError(f"damping must be a finite number >= 0, got {damping}")

    work = torch.float64 if float64_updates else torch.promote_types(weight.dtype, torch.float32)
    if overwrite_hessian and weight.dtype == work and weight.is_contiguous():
        w = weight.detach()  # the caller gives the weight up too: updated in its own memory
    else:
        w = weight.detach().to(work, copy=True)  # one copy, whatever the weights' dtype
    factor = _inverse_cholesky_factor(
        hessian.detach().to(w.device), w, damping, statistics_dtype, overwrite_hessian
    )
    mask = torch.ones_like(w, dtype=torch.bool)
    for start in range(0, columns, block_size):
        stop = min(start + block_size, columns)
        block = w[:, start:stop]  # a view: updates land in w
        # This block's rows of the factor in ``work``, column-major as LAPACK left them (the
        # products' bits depend on the layout): a [B, in] copy, not a second [in, in] matrix.
        factor_rows = torch.empty_strided(
            (stop - start, columns), (1, stop - start), dtype=work, device=w.device
        ).copy_(factor[start:stop])
        block_factor = factor_rows[:, start:stop]
        diagonal = block_factor.diagonal()
        keep = mask[:, start:stop]
        drop = torch.empty_like(keep)
        if shape is None:
            scores = block.square() / diagonal.square()
            keep.copy_(_unstructured_keep(scores, sparsity, per_row))
            torch.logical_not(keep, out=drop)
        errors = torch.empty_like(block)  # every column is written below
        for i in range(stop - start):
            if shape is not None and i % shape[1] == 0:
                group = slice(i, i + shape[1])
                scores = block[:, group].square() / diagonal[group].square()
                keep[:, group] = keep_largest_in_groups(scores, shape[1], shape[1] - shape[0])
                torch.logical_not(keep[:, group], out=drop[:, group])
            column = block[:, i]
            # (column - kept) / U_ii, where kept is the column with its pruned entries zeroed:
            # the pruned entries as they are and +0 for the kept ones (x - x = +0), divided
            # straight into its column of ``errors``; then the pruned entries are zeroed in place
            error = errors[:, i]
            torch.div(column.masked_fill(keep[:, i], 0), diagonal[i], out=error)
            column.masked_fill_(drop[:, i], 0)
            block[:, i + 1 :] -= torch.outer(error, block_factor[i, i + 1 :])
        later = factor_rows[:, stop:]
        for rows in range(0, w.shape[0], UPDATE_ROWS):  # a [rows, later] product at a time
            w[rows : rows + UPDATE_ROWS, stop:] -= errors[rows : rows + UPDATE_ROWS] @ later
    if not _all_finite(w):
        raise ValueError(
            "SparseGPT's update produced non-finite weights: the layer's weights or its"
            " calibration inputs hold NaN or infinite values"
        )
    return w.to(weight.dtype), mask


def _unstructured_keep(scores: Tensor, sparsity: float, per_row: bool) -> Tensor:
    """The keep-mask of one block's saliency ``scores`` [out, B]."""
    if per_row:
        columns = scores.shape[1]
        return keep_largest_in_groups(scores, columns, count_to_prune(sparsity, columns))
    if sparsity == 0:
        return torch.ones_like(scores, dtype=torch.bool)
    flat = scores.reshape(-1)
    # The authors' rule: prune everything at or below the int(numel * sparsity)-th lowest.
    threshold = torch.kthvalue(flat, int(flat.numel() * sparsity) + 1).values
    return scores > threshold


def _inverse_cholesky_factor(
    hessian: Tensor,
    weight: Tensor,
    damping: float,
    dtype: torch.dtype = torch.float64,
    overwrite: bool = False,
) -> Tensor:
    """The upper Cholesky factor of the damped ``H^-1``; zeroes ``weight``'s dead columns.

    With ``overwrite`` (and a CPU Hessian in ``dtype``), computed in ``hessian``'s own memory
    (:mod:`convergent.sparse.inverse_factor`: the same bits, no second ``[in, in]`` matrix;
    ``hessian`` is consumed). A damping that leaves ``H`` (or its inverse) without a Cholesky
    factor is raised tenfold, up to :data:`DAMPING_RETRIES` times (none when it is 0), each
    retry logged."""
    diagonal = hessian.diagonal().to(dtype, copy=True)  # never the caller's
    dead = diagonal == 0
    diagonal[dead] = 1.0
    weight[:, dead] = 0.0
    mean = diagonal.mean()
    tries = [damping * 10**attempt for attempt in range(DAMPING_RETRIES + 1 if damping else 1)]
    if overwrite and hessian.dtype == dtype and lapack(hessian) is not None:
        attempt_at = _in_place_attempts(hessian, diagonal, mean)
    else:
        attempt_at = _copied_attempts(hessian, diagonal, mean, dtype)
    for attempt, current in enumerate(tries):
        factor = attempt_at(current)
        if factor is not None:
            return factor
        if attempt + 1 < len(tries):
            logger.warning(
                "SparseGPT: the Hessian damped at %g is not positive definite; retrying at"
                " damping %g",
                current,
                tries[attempt + 1],
            )
    raise ValueError(
        f"the Hessian is not positive definite even at damping {tries[-1]:g}"
        + (f" (tried {', '.join(f'{t:g}' for t in tries)})" if len(tries) > 1 else "")
        + "; its calibration inputs are degenerate or non-finite (pass more calibration"
        " examples, or a damping > 0 such as 0.01)"
    )


def _in_place_attempts(
    hessian: Tensor, diagonal: Tensor, mean: Tensor
) -> Callable[[float], Tensor | None]:
    """One try per damping in ``hessian``'s memory (it keeps ``H`` for the next try)."""
    mirror_upper_to_lower(hessian)

    def attempt_at(current: float) -> Tensor | None:
        return factor_in_place(hessian, diagonal + current * mean)[0]

    return attempt_at


def _copied_attempts(
    hessian: Tensor, diagonal: Tensor, mean: Tensor, dtype: torch.dtype
) -> Callable[[float], Tensor | None]:
    """One try per damping on a copy of ``hessian``: the factor, or None where it fails."""
    # One [in, in] matrix beside ``hessian``: a column-major (LAPACK's order) copy that the
    # Cholesky factorization, the inverse and the second factorization each overwrite in
    # place (given a row-major matrix, each would copy it first).
    columns = hessian.shape[0]
    factor = torch.empty_strided(
        (columns, columns), (1, columns), dtype=dtype, device=hessian.device
    )
    info = torch.zeros((), dtype=torch.int32, device=hessian.device)

    def attempt_at(current: float) -> Tensor | None:
        # H's upper triangle, read by the lower factorization as its lower one (a symmetric H
        # reads the same either way; SparseGPT's summed statistic holds only the upper)
        factor.copy_(hessian.T)
        factor.diagonal().copy_(diagonal + current * mean)
        torch.linalg.cholesky_ex(factor, out=(factor, info))  # the lower factor L of H
        if int(info) == 0:
            torch.cholesky_inverse(factor, out=factor)  # H^-1 from L
            torch.linalg.cholesky_ex(factor, upper=True, out=(factor, info))
            if int(info) == 0 and _all_finite(factor):
                return factor
        return None

    return attempt_at


def _all_finite(matrix: Tensor, columns: int = 64) -> bool:
    """Whether every entry is finite, checked a slab of columns at a time (``isfinite`` of the
    whole matrix allocates more than another copy of it: 27 MiB at a 1536 x 4096 float32 weight,
    measured)."""
    return all(bool(torch.isfinite(slab).all()) for slab in matrix.split(columns, dim=1))


@dataclass(frozen=True)
class SparseGPT:
    """SparseGPT behind the calibrated-pruner interface (:mod:`convergent.sparse.pruners`).

    Attributes:
        block_size: columns per block (the unstructured mask is chosen once per block).
        damping: ``lambda / mean(diag H)``, >= 0.
        per_row: choose the unstructured mask per row of each block (this library before
            issue 48) instead of over the whole block (the authors' rule).
        float64_updates: run the column loop in float64 whatever the weights' dtype (this
            library before issue 48; 1.0-1.6x slower on a CPU than float32).
        statistics: the dtype of the Hessian and its factorizations, ``"float64"`` (the
            default, which the studies' units were computed with) or ``"float32"``.
    """

    name: ClassVar[str] = "sparsegpt"
    calibrated: ClassVar[bool] = True
    block_size: int = 128
    damping: float = 0.01
    per_row: bool = False
    float64_updates: bool = False
    statistics: str = "float64"

    def __post_init__(self) -> None:
        check_statistics(self.statistics)
        if not (isinstance(self.block_size, int) and self.block_size >= 1):
            raise ValueError(f"block_size must be an integer >= 1, got {self.block_size}")
        if not (math.isfinite(self.damping) and self.damping >= 0):
            raise ValueError(f"damping must be a finite number >= 0, got {self.damping}")

    def statistic(self, inputs: Tensor, total: Tensor | None = None) -> Tensor:
        """``X^T X``'s upper triangle over one batch's tokens (in ``statistics``), added into
        ``total`` in place when given (see :func:`add_hessian_upper`)."""
        return add_hessian_upper(inputs, STATISTICS_DTYPES[self.statistics], total)

    def prune(
        self,
        rows: Tensor,
        statistic: Tensor,
        sparsity: float,
        n_m: tuple[int, int] | None,
        consume: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """``(pruned and updated weight, keep mask)`` of ``rows`` [out, in]; with ``consume``,
        the Hessian is factored, and the rows updated, in their own memory
        (``overwrite_hessian``)."""
        return sparsegpt_prune(
            rows,
            statistic,
            sparsity,
            n_m,
            self.block_size,
            self.damping,
            self.per_row,
            self.float64_updates,
            STATISTICS_DTYPES[self.statistics],
            overwrite_hessian=consume,
        )
