"""What the ``sparsity`` study measures in a trained model: perplexity after one-shot pruning
by each pruner (Wanda and SparseGPT calibrated on a fixed draw of training windows), the share
of weights near zero and a fixed sample of them for the histograms.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from convergent.data import DictDataset
from convergent.sparse import perplexity, prune_one_shot
from convergent.studies.sparsity.config import (
    LANGUAGE_MODEL_MASKS,
    LM_PRUNER_OPTIONS,
    RMS_FRACTION,
    VISION_MASKS,
    sparsity_key,
)
from convergent.studies.sparsity.models import subset

HISTOGRAM_WEIGHTS = 20000  # weights kept per dense model for the histograms
EVALUATION_BATCH = 128  # windows per forward pass when scoring or calibrating an LM


def _batches(
    dataset: Dataset[Any], batch_size: int, keys: tuple[str, ...] | None = None
) -> list[dict[str, torch.Tensor]]:
    assert isinstance(dataset, DictDataset)
    tensors = {k: v for k, v in dataset.tensors.items() if keys is None or k in keys}
    return [
        {key: value[start : start + batch_size] for key, value in tensors.items()}
        for start in range(0, len(dataset), batch_size)
    ]


def dataset_perplexity(
    model: nn.Module, dataset: Dataset[Any], batch_size: int = EVALUATION_BATCH
) -> float:
    """Perplexity of ``model`` over a token dataset (``input_ids``, aligned ``labels``)."""
    return perplexity(model, _batches(dataset, batch_size))


def calibration_batches(train: Dataset[Any], windows: int) -> list[dict[str, torch.Tensor]]:
    """Wanda's and SparseGPT's calibration: ``windows`` training windows (the first of a
    seeded shuffle, the same for every run), as batches of ``input_ids``."""
    return _batches(subset(train, windows), EVALUATION_BATCH, ("input_ids",))


def pruned_perplexities(
    model: nn.Module,
    dataset: Dataset[Any],
    sparsities: tuple[float, ...],
    pruners: tuple[str, ...] = ("magnitude",),
    calibration: list[dict[str, torch.Tensor]] | None = None,
) -> dict[str, dict[str, float]]:
    """``{pruner: {"0%": dense, "50%": ...}}``: perplexity after one-shot layer-wise pruning of a
    copy of ``model`` by each pruner at each sparsity (``calibration``: the batches Wanda and
    SparseGPT read; the dense perplexity is computed once and shown in every pruner's row)."""
    dense = dataset_perplexity(model, dataset)
    scores: dict[str, dict[str, float]] = {}
    for pruner in pruners:
        scores[pruner] = {"0%": dense}
        for target in sparsities:
            pruned = copy.deepcopy(model)
            prune_one_shot(
                pruned,
                target,
                spec=LANGUAGE_MODEL_MASKS,
                method=pruner,
                calibration=None if pruner == "magnitude" else calibration,
                options=LM_PRUNER_OPTIONS.get(pruner),
            )
            scores[pruner][sparsity_key(target)] = dataset_perplexity(pruned, dataset)
    return scores


def prunable_weights(model: nn.Module) -> list[torch.Tensor]:
    """The prunable weight tensors of ``model`` (attention and feed-forward matrices)."""
    parameters = dict(model.named_parameters())
    return [parameters[name].detach() for name in VISION_MASKS.select(model).names]


def near_zero_share(weights: list[torch.Tensor], fraction: float = RMS_FRACTION) -> float:
    """The share of weights whose magnitude is below ``fraction`` x their tensor's RMS.

    Scale-free: multiplying a tensor by a constant does not change it, so optimizers that
    leave weights at different scales compare fairly. A Gaussian tensor has about
    ``0.8 * fraction`` of its weights there (``erf(fraction / sqrt(2))``).
    """
    below = sum(int((w.abs() < fraction * w.square().mean().sqrt()).sum()) for w in weights)
    return below / max(1, sum(w.numel() for w in weights))


def histogram_sample(weights: list[torch.Tensor], seed: int = 0) -> torch.Tensor:
    """Up to ``HISTOGRAM_WEIGHTS`` weights, each divided by its tensor's RMS (a fixed draw)."""
    scaled = torch.cat([(w / w.square().mean().sqrt()).reshape(-1) for w in weights]).float()
    if scaled.numel() <= HISTOGRAM_WEIGHTS:
        return scaled
    order = torch.randperm(scaled.numel(), generator=torch.Generator().manual_seed(seed))
    return scaled[order[:HISTOGRAM_WEIGHTS]].clone()
