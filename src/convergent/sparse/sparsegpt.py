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

The mask is chosen by the saliency ``W_ij^2 / U_jj^2`` on the current weights: per row, the
lowest ``round(sparsity * B)`` of every block of ``B = block_size`` columns at the block's start
(the authors' code thresholds a block over all rows at once; here each row prunes the same
count), or for N:M the N highest of every M columns when the group's first column is reached.
Inside a block the update is applied column by column; the block's errors reach the later blocks
in one product ``W[:, later] -= Err @ U[block, later]``, which is the same arithmetic, reordered.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from convergent.sparse.masks import check_sparsity
from convergent.sparse.spec import check_n_m_fits
from convergent.sparse.topk import count_to_prune, keep_largest_in_groups


def hessian(inputs: Tensor) -> Tensor:
    """``X^T X`` over the tokens of one batch (float64, [in, in]); batches add up.

    Args:
        inputs: calibration inputs [..., in] (every leading dimension counts as tokens).
    """
    if inputs.ndim < 1:
        raise ValueError("inputs must have a feature dimension (ndim >= 1), got a 0-d tensor")
    features = inputs.detach().reshape(-1, inputs.shape[-1]).to(torch.float64)
    return features.T @ features


def sparsegpt_prune(
    weight: Tensor,
    hessian: Tensor,
    sparsity: float,
    pattern: str,
    block_size: int = 128,
    damping: float = 0.01,
) -> tuple[Tensor, Tensor]:
    """Prune one weight matrix with SparseGPT (see the module docstring for the update rule).

    Args:
        weight: the layer's weight [out, in].
        hessian: ``X^T X`` summed over the calibration tokens, [in, in] (see :func:`hessian`).
        sparsity: the fraction of each row to prune in every block, in [0, 1) (checked but not
            used for N:M, which prunes 1 - N/M).
        pattern: ``"unstructured"`` or ``"N:M"`` (e.g. ``"2:4"``); N:M needs M to divide both
            ``in`` and ``block_size``.
        block_size: columns per block (the unstructured mask is chosen once per block).
        damping: ``lambda / mean(diag H)``, >= 0.

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

    w = weight.detach().to(torch.float64).clone()
    factor = _inverse_cholesky_factor(hessian.detach().to(w.device), w, damping)
    mask = torch.ones_like(w, dtype=torch.bool)
    for start in range(0, columns, block_size):
        stop = min(start + block_size, columns)
        block = w[:, start:stop]  # a view: updates land in w
        block_factor = factor[start:stop, start:stop]
        diagonal = block_factor.diagonal()
        keep = mask[:, start:stop]
        if shape is None:
            count = count_to_prune(sparsity, stop - start)
            scores = block.square() / diagonal.square()
            keep.copy_(keep_largest_in_groups(scores, stop - start, count))
        errors = torch.zeros_like(block)
        for i in range(stop - start):
            if shape is not None and i % shape[1] == 0:
                group = slice(i, i + shape[1])
                scores = block[:, group].square() / diagonal[group].square()
                keep[:, group] = keep_largest_in_groups(scores, shape[1], shape[1] - shape[0])
            column = block[:, i]
            kept = torch.where(keep[:, i], column, torch.zeros_like(column))
            errors[:, i] = (column - kept) / diagonal[i]
            block[:, i] = kept
            block[:, i + 1 :] -= torch.outer(errors[:, i], block_factor[i, i + 1 :])
        w[:, stop:] -= errors @ factor[start:stop, stop:]
    return w.to(weight.dtype), mask


def _inverse_cholesky_factor(hessian: Tensor, weight: Tensor, damping: float) -> Tensor:
    """The upper Cholesky factor of the damped ``H^-1``; zeroes ``weight``'s dead columns."""
    h = hessian.to(torch.float64).clone()
    diagonal = h.diagonal()  # a view
    dead = diagonal == 0
    diagonal[dead] = 1.0
    weight[:, dead] = 0.0
    diagonal += damping * diagonal.mean()
    lower, info = torch.linalg.cholesky_ex(h)
    if int(info) != 0:
        raise ValueError(
            f"the damped Hessian is not positive definite at damping {damping}; use a damping"
            " > 0 (e.g. 0.01) or a symmetric positive semi-definite Hessian"
        )
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)
