"""Magnitude pruning of one layer behind the pruner interface (:mod:`convergent.sparse.pruners`).

Per layer: keep the largest ``|W_ij|`` (exactly ``round(sparsity * numel)`` pruned, ties by
position, as :func:`~convergent.sparse.uniform_magnitude_masks`), or the N largest of every M
consecutive inputs. It reads no calibration data; the block-by-block driver runs it when a
layer's sparsity comes from OWL or when blocks stream from disk. Whole-model magnitude pruning
(one global threshold, or every layer at once) is :func:`~convergent.sparse.magnitude_masks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from convergent.sparse.masks import check_sparsity, n_m_mask
from convergent.sparse.topk import count_to_prune, keep_largest


@dataclass(frozen=True)
class Magnitude:
    """Per-layer magnitude pruning (no options, no calibration)."""

    name: ClassVar[str] = "magnitude"
    calibrated: ClassVar[bool] = False

    def statistic(self, inputs: Tensor, total: Tensor | None = None) -> Tensor:
        """Magnitude reads no inputs: an empty statistic."""
        return inputs.new_zeros(0) if total is None else total

    def prune(
        self,
        rows: Tensor,
        statistic: Tensor,
        sparsity: float,
        n_m: tuple[int, int] | None,
        consume: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """``(pruned weight, keep mask)`` of ``rows`` [out, in]; kept weights are unchanged (``consume`` changes nothing here: the statistic is read, not overwritten.)"""
        check_sparsity(sparsity)
        if n_m is not None:
            keep = n_m_mask(rows, n_m[0], n_m[1], 1)
        else:
            keep = keep_largest([rows], count_to_prune(sparsity, rows.numel()))[0]
        return torch.where(keep, rows, torch.zeros_like(rows)), keep
