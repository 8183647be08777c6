"""Sparse training: magnitude masks, their enforcement, the AC/DC schedule, one-shot pruning.

    from convergent.sparse import MaskSpec, magnitude_masks
    spec = MaskSpec(distribution="global")                # one spec: selection, distribution, pattern
    selection = spec.select(model)                        # weight matrices, minus exclusions
    masks = magnitude_masks(model, selection.names, 0.9, spec)  # global magnitude, exact top-k
    masks.apply(model)                                    # w <- w * mask

Training with masks (re-masked after every step, AC/DC phase flips) is
:class:`convergent.train.masked.MaskedStep`; this package knows nothing of training loops.
`SparsityCheck` is its acting check (is the target reached?), registered there.
"""

from convergent.sparse.acdc import ACDCSchedule, Phase
from convergent.sparse.enforce import RESET_HOWS, RESETS, check_reset, reset_optimizer_state
from convergent.sparse.gmp import GradualSchedule
from convergent.sparse.magnitude import Magnitude
from convergent.sparse.masks import (
    Masks,
    global_magnitude_masks,
    layer_sparsity,
    magnitude_masks,
    n_m_mask,
    n_m_masks,
    uniform_magnitude_masks,
)
from convergent.sparse.oneshot import PruningReport, perplexity, prune_one_shot
from convergent.sparse.owl import outlier_ratio, owl_sparsities
from convergent.sparse.pruners import METHODS, PRUNERS, Pruner, make_pruner
from convergent.sparse.selection import Selection, is_conv1d, select_prunable
from convergent.sparse.sparsegpt import SparseGPT, hessian, sparsegpt_prune
from convergent.sparse.sparsity_check import SparsityCheck
from convergent.sparse.spec import DISTRIBUTIONS, PATTERNS, MaskSpec, parse_pattern
from convergent.sparse.topk import (
    Threshold,
    count_to_prune,
    keep_largest,
    magnitude_threshold,
    magnitude_threshold_reference,
)
from convergent.sparse.wanda import Wanda, input_squared_norms, wanda_mask

__all__ = [
    "DISTRIBUTIONS",
    "METHODS",
    "PATTERNS",
    "PRUNERS",
    "RESETS",
    "RESET_HOWS",
    "ACDCSchedule",
    "GradualSchedule",
    "Magnitude",
    "MaskSpec",
    "Masks",
    "Phase",
    "Pruner",
    "PruningReport",
    "Selection",
    "SparseGPT",
    "SparsityCheck",
    "Threshold",
    "Wanda",
    "check_reset",
    "count_to_prune",
    "global_magnitude_masks",
    "hessian",
    "input_squared_norms",
    "is_conv1d",
    "keep_largest",
    "layer_sparsity",
    "magnitude_masks",
    "magnitude_threshold",
    "magnitude_threshold_reference",
    "make_pruner",
    "n_m_mask",
    "n_m_masks",
    "outlier_ratio",
    "owl_sparsities",
    "parse_pattern",
    "perplexity",
    "prune_one_shot",
    "reset_optimizer_state",
    "select_prunable",
    "sparsegpt_prune",
    "uniform_magnitude_masks",
    "wanda_mask",
]
