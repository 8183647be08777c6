"""Wanda: prune by weight magnitude times input norm, within each output row.

Sun, Liu, Bair and Kolter, "A Simple and Effective Pruning Approach for Large Language Models"
(2023, arXiv:2306.11695). For a linear layer ``y = W x`` with ``W`` [out, in] and calibration
inputs ``X`` [tokens, in], every weight is scored

    S_ij = |W_ij| * ||X_j||_2,

and each output row keeps its largest scores: the ``int(in * sparsity)`` lowest of the row are
pruned, as the authors' code counts them (unstructured; ``rounding="nearest"`` prunes
``round(sparsity * in)``, this library's count before it followed the authors), or the N largest
of every M consecutive inputs are kept (N:M). The kept weights are not changed. Ties go as in the
authors' stable sort: of equal scores the earlier inputs are pruned first.

The statistics are sums over tokens, so batches (and processes, through an all-reduce) add up::

    squared_norms = sum(input_squared_norms(batch) for batch in calibration)
    keep = wanda_mask(weight, squared_norms, 0.5, "unstructured")

:class:`Wanda` is the same rule behind the calibrated-pruner interface
(:mod:`convergent.sparse.pruners`) that the block-by-block driver runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from convergent.sparse.masks import check_sparsity
from convergent.sparse.spec import STATISTICS_DTYPES, check_n_m_fits, check_statistics
from convergent.sparse.topk import count_to_prune, keep_largest_in_groups

# How many weights of a row of ``in`` inputs a sparsity prunes: "down" is the authors'
# ``int(in * sparsity)``; "nearest" is ``round(sparsity * in)`` (this library before issue 48,
# kept for the studies whose committed numbers were computed with it).
ROUNDINGS = ("down", "nearest")


def input_squared_norms(
    inputs: Tensor, dtype: torch.dtype = torch.float64, total: Tensor | None = None
) -> Tensor:
    """The squared norm of every input feature over the tokens of one batch, ready to be summed.

    Args:
        inputs: calibration inputs [..., in] (every leading dimension counts as tokens).
        dtype: the dtype they are summed in (float64, or float32).
        total: the earlier batches' sum, [in] in ``dtype``: this batch's is added into it in
            place (the same bits as ``total + this batch's``) and it is returned.

    Returns:
        ``sum over tokens of x_j^2`` in ``dtype``, shape [in]; sums over batches add up to the
        whole set's, and :func:`norms_from_squares` turns them into ``||X_j||_2``.
    """
    if inputs.ndim < 1:
        raise ValueError("inputs must have a feature dimension (ndim >= 1), got a 0-d tensor")
    features = inputs.detach().reshape(-1, inputs.shape[-1]).to(dtype)
    if total is None:
        return features.square().sum(dim=0)
    if total.shape != (features.shape[1],) or total.dtype != dtype:
        raise ValueError(
            f"total must be a ({features.shape[1]},) {dtype} vector to add this batch into,"
            f" got {tuple(total.shape)} {total.dtype}"
        )
    return total.add_(features.square().sum(dim=0))


def norms_from_squares(squared_norms: Tensor) -> Tensor:
    """``||X_j||_2`` from the accumulated squares of :func:`input_squared_norms` (float64)."""
    if bool((squared_norms < 0).any()):
        raise ValueError(
            f"squared norms must be >= 0, got a minimum of {float(squared_norms.min())}"
        )
    return squared_norms.detach().to(torch.float64).sqrt()


def wanda_scores(weight: Tensor, squared_norms: Tensor) -> Tensor:
    """Wanda's scores ``S_ij = |W_ij| * ||X_j||_2`` (float64, shaped like ``weight``).

    Args:
        weight: the layer's weight [out, in].
        squared_norms: the accumulated squares of the inputs, [in] (see :func:`input_squared_norms`).
    """
    if weight.ndim != 2:
        raise ValueError(f"weight must be [out, in] (2-D), got shape {tuple(weight.shape)}")
    if squared_norms.shape != (weight.shape[1],):
        raise ValueError(
            f"squared_norms must have shape ({weight.shape[1]},) to match the weight's inputs,"
            f" got {tuple(squared_norms.shape)}"
        )
    norms = norms_from_squares(squared_norms).to(weight.device)
    return weight.detach().to(torch.float64).abs() * norms


def pruned_per_row(sparsity: float, columns: int, rounding: str = "down") -> int:
    """How many of a row's ``columns`` weights Wanda prunes at ``sparsity`` (see
    :data:`ROUNDINGS`)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    check_sparsity(sparsity)
    return int(columns * sparsity) if rounding == "down" else count_to_prune(sparsity, columns)


def wanda_mask(
    weight: Tensor,
    squared_norms: Tensor,
    sparsity: float,
    pattern: str | tuple[int, int] | None = None,
    rounding: str = "down",
) -> Tensor:
    """Wanda's keep-mask (True = keep) for one weight matrix.

    Update rule: ``S = |W| * ||X_j||_2``; per output row, prune the ``int(in * sparsity)``
    lowest ``S`` (unstructured) or keep the N highest ``S`` of every M consecutive inputs (N:M).

    Args:
        weight: the layer's weight [out, in].
        squared_norms: the accumulated squares of the inputs, [in] (see :func:`input_squared_norms`).
        sparsity: the fraction of each row to prune, in [0, 1) (checked but not used for N:M,
            which prunes 1 - N/M).
        pattern: ``"unstructured"`` or None, or ``"N:M"`` / ``(N, M)`` (e.g. ``"2:4"``); N:M
            needs ``in`` to be a multiple of M.
        rounding: ``"down"`` (the authors' count) or ``"nearest"`` (see :data:`ROUNDINGS`).

    Returns:
        A bool tensor shaped like ``weight``.
    """
    columns = weight.shape[1] if weight.ndim == 2 else 0
    prune = pruned_per_row(sparsity, columns, rounding)
    scores = wanda_scores(weight, squared_norms)
    shape = check_n_m_fits(pattern, columns)
    if shape is None:
        return keep_largest_in_groups(scores, columns, prune)
    n, m = shape
    return keep_largest_in_groups(scores, m, m - n)


@dataclass(frozen=True)
class Wanda:
    """Wanda behind the calibrated-pruner interface (:mod:`convergent.sparse.pruners`).

    Attributes:
        rounding: how many weights a row loses (see :data:`ROUNDINGS`): ``"down"``, the
            authors' ``int(in * sparsity)``, or ``"nearest"``.
        statistics: the dtype the input norms are summed in, ``"float64"`` (the default,
            which the studies' units were computed with) or ``"float32"``.
    """

    name: ClassVar[str] = "wanda"
    calibrated: ClassVar[bool] = True
    rounding: str = "down"
    statistics: str = "float64"

    def __post_init__(self) -> None:
        check_statistics(self.statistics)
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")

    def statistic(self, inputs: Tensor, total: Tensor | None = None) -> Tensor:
        """The squared norm of every input feature over one batch's tokens, added into
        ``total`` in place when given."""
        return input_squared_norms(inputs, STATISTICS_DTYPES[self.statistics], total)

    def prune(
        self,
        rows: Tensor,
        statistic: Tensor,
        sparsity: float,
        n_m: tuple[int, int] | None,
        consume: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """``(pruned weight, keep mask)`` of ``rows`` [out, in]; kept weights are unchanged (``consume`` changes nothing here: the statistic is read, not overwritten.)"""
        keep = wanda_mask(rows, statistic, sparsity, n_m, self.rounding)
        return torch.where(keep, rows, torch.zeros_like(rows)), keep
