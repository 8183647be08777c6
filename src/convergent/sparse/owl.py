"""OWL: outlier-weighted layer-wise sparsity (Yin et al., "Outlier Weighed Layerwise Sparsity
(OWL)", ICML 2024, arXiv:2310.05175).

OWL gives each Transformer block its own sparsity, lower where more of its weights matter
for outlier activations. For block l, with the Wanda scores ``S_ij = |W_ij| * ||X_j||_2`` of
all its prunable layers (on the dense model's calibration inputs):

    D_l  = share of the block's scores above M * mean(scores of the block)    (outlier ratio)
    D~_l = (D_l - min D) / (max D - min D)                                     (min-max scaled)
    k_l  = 2 * lambda * D~_l + c,   c such that the mean of k_l is 1 - s       (kept share)
    s_l  = 1 - k_l                                                              (its sparsity)

so the blocks' sparsities span ``2 * lambda`` around the target ``s`` and average to it (the
mean weighted by each block's count of prunable weights, which is the plain mean when the
blocks are alike, as in the paper). M = 5 and lambda = 0.08 are the paper's values and the
defaults of :class:`~convergent.sparse.MaskSpec` (``owl_m``, ``owl_lmbda``: llm-compressor's
names). Blocks whose ratios are all equal keep the target.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from convergent.wording import option


def outlier_ratio(scores: Sequence[Tensor], m: float) -> float:
    """The share of ``scores`` (all of one block's, pooled) above ``m`` times their mean.

    Args:
        scores: one block's Wanda scores, one tensor per prunable layer.
        m: the outlier threshold, as a multiple of the block's mean score (> 0).
    """
    if not scores:
        raise ValueError("a block needs at least one score tensor to have an outlier ratio")
    total = sum(score.numel() for score in scores)
    mean = sum(float(score.double().sum()) for score in scores) / total
    above = sum(int((score.double() > m * mean).sum()) for score in scores)
    return above / total


def owl_sparsities(
    ratios: Sequence[float], sizes: Sequence[int], sparsity: float, lmbda: float
) -> list[float]:
    """Each block's sparsity from its outlier ratio (see the module docstring).

    Args:
        ratios: each block's outlier ratio D_l.
        sizes: each block's number of prunable weights (the weights of the mean).
        sparsity: the target mean sparsity, in [0, 1).
        lmbda: half the span of the blocks' sparsities, >= 0.

    Returns:
        One sparsity per block, in the blocks' order.

    Raises:
        ValueError: when a block's sparsity would leave [0, 1) (a target too close to 0 or 1
            for this lambda).
    """
    if len(ratios) != len(sizes) or not ratios:
        raise ValueError(
            f"ratios and sizes must be equally long and not empty, got {len(ratios)} and"
            f" {len(sizes)}"
        )
    low, high = min(ratios), max(ratios)
    scaled = [(r - low) / (high - low) if high > low else 0.0 for r in ratios]
    kept = [2 * lmbda * value for value in scaled]
    shift = (1 - sparsity) - sum(k * n for k, n in zip(kept, sizes, strict=True)) / sum(sizes)
    result = [1 - (k + shift) for k in kept]
    outside = [value for value in result if not 0 <= value < 1]
    if outside:
        raise ValueError(
            f"OWL at {option('sparsity', sparsity)} and {option('owl_lmbda', lmbda)} would give a"
            f" block the sparsity {outside[0]:.4f}, outside [0, 1); lower {option('owl_lmbda')}"
            f" or move {option('sparsity')} away from 0 and 1"
        )
    return result
