"""What the ``descent`` study measures on a trained model, as functions of plain arguments.

How hard the constraints pushed during training (:func:`multiplier_activity`,
:func:`dual_trajectory`: the manipulation check of every claim), the per-layer losses and
which descent constraints hold (:func:`layer_report`), accuracy under token-embedding
perturbations (:func:`robustness`) and denoising RMSE at several noise levels
(:func:`denoising_rmse`), a language model's loss on
each test sequence (:func:`sequence_losses`) and the pairwise win marks of two models
(:func:`sequence_wins`, part (c)'s analogue of AlpacaEval's judgement). Every perturbation is
drawn from a fixed seed, so ERM and the constrained model see the same draws (paired
comparison).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from convergent.data import DictDataset, perturbed_embeddings
from convergent.diagnostics import monotonicity_report
from convergent.losses import IGNORE_INDEX
from convergent.train import dataset_layer_losses, evaluate, split_batch

TRAJECTORY_POINTS = 100  # multiplier and slack records kept per run (evenly spaced steps)


def multiplier_activity(history: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """How hard the descent constraints pushed during training, from ``fit``'s history.

    A primal-dual step logs ``lambda_1 .. lambda_L`` each step (after that step's dual
    update). A run whose multipliers stay near 0 trained on f_L alone: ERM in all but name.

    Args:
        history: the per-step records ``fit`` returns; records of other splits and records
            without multipliers (ERM) are ignored.

    Returns:
        ``{"multiplier_max": max over steps and layers of lambda_l,
        "multiplier_active_share": share of logged steps with some lambda_l > 0}``; both
        None when no record holds a multiplier.
    """
    per_step = [
        [float(value) for key, value in record.items() if key.startswith("lambda_")]
        for record in history
        if record.get("split", "train") == "train"
    ]
    per_step = [values for values in per_step if values]
    if not per_step:
        return {"multiplier_max": None, "multiplier_active_share": None}
    return {
        "multiplier_max": max(max(values) for values in per_step),
        "multiplier_active_share": sum(max(values) > 0 for values in per_step) / len(per_step),
    }


def dual_trajectory(
    history: Sequence[Mapping[str, Any]], points: int = TRAJECTORY_POINTS
) -> dict[str, Any]:
    """The multipliers lambda_l, resilient slacks u_l and constraint slacks s_l over training.

    Args:
        history: ``fit``'s per-step records; those without ``lambda_1`` (ERM) are skipped.
        points: at most this many evenly spaced records are kept (the last one always).

    Returns:
        ``{"steps": [...], "lambda": [[per step] per layer], "u": ..., "slack": ...}`` (a
        key's lists are empty when no record holds it); all empty for ERM.
    """
    records = [r for r in history if r.get("split", "train") == "train" and "lambda_1" in r]
    if len(records) > points:
        stride = len(records) / points
        kept = [records[min(len(records) - 1, int(i * stride))] for i in range(points - 1)]
        records = [*kept, records[-1]]
    layers = sum(1 for key in records[0] if key.startswith("lambda_")) if records else 0

    def series(prefix: str) -> list[list[float]]:
        if not records or f"{prefix}_1" not in records[0]:
            return []
        return [[float(r[f"{prefix}_{layer}"]) for r in records] for layer in range(1, layers + 1)]

    return {
        "steps": [int(r.get("step", index + 1)) for index, r in enumerate(records)],
        "lambda": series("lambda"),
        "u": series("u"),
        "slack": series("slack"),
    }


def layer_report(
    model: nn.Module, data: Any, task: str, alpha: float, batch_size: int = 256
) -> dict[str, Any]:
    """Per-layer losses on ``data``, and which descent constraints hold there."""
    losses = dataset_layer_losses(model, data, task, batch_size).tolist()
    at_alpha = monotonicity_report(losses, alpha)
    monotone = monotonicity_report(losses, 0.0)
    return {
        "layer_losses": losses,
        "fraction_satisfied": at_alpha.fraction_satisfied,
        "satisfied": list(at_alpha.satisfied),
        "is_monotone": monotone.is_monotone,
        "largest_increase": monotone.largest_increase,
    }


def robustness(
    model: nn.Module,
    test: Any,
    levels: Mapping[str, Sequence[float]],
    skip_token_ids: Sequence[int],
    seed: int,
) -> dict[str, Any]:
    """Clean test accuracy and accuracy under each perturbation kind at each level.

    The perturbation generator is seeded identically for every model, so ERM and
    constrained models see the same noise draws (paired comparison).
    """
    out: dict[str, Any] = {"clean": evaluate(model, test, "classification")["accuracy"]}
    for kind, gammas in levels.items():
        accuracies = []
        for gamma in gammas:
            with perturbed_embeddings(model, kind, gamma, seed=seed, skip_token_ids=skip_token_ids):
                accuracies.append(evaluate(model, test, "classification")["accuracy"])
        out[kind] = accuracies
    return out


def noisy_pairs(clean: torch.Tensor, sigma: float, seed: int) -> DictDataset:
    """``{"inputs": clean + sigma * noise, "labels": clean}`` with seeded Gaussian noise."""
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(seed))
    return DictDataset({"inputs": clean + sigma * noise, "labels": clean})


def denoising_rmse(
    model: nn.Module, clean: torch.Tensor, sigmas: Sequence[float], seed: int
) -> list[float]:
    """Test RMSE (pixels in [0, 1]) at each noise level, same noise draws for every model."""
    return [
        evaluate(model, noisy_pairs(clean, sigma, seed + index), "regression")["rmse"]
        for index, sigma in enumerate(sigmas)
    ]


@torch.no_grad()
def sequence_losses(
    model: nn.Module, dataset: DictDataset, batch_size: int = 64
) -> tuple[list[float], float]:
    """Each sequence's mean next-token cross-entropy, in the dataset's order, and the
    perplexity of the whole dataset (exp of the mean over all its target tokens).

    The batches are the same for every model scored on ``dataset``, so a seeded embedding
    perturbation draws the same noise for each of them.
    """
    was_training = model.training
    model.eval()
    means: list[float] = []
    total, count = 0.0, 0
    for start in range(0, len(dataset), batch_size):
        batch = {key: value[start : start + batch_size] for key, value in dataset.tensors.items()}
        inputs, labels = split_batch(batch)
        logits = model(**inputs).logits.float()
        losses = F.cross_entropy(
            logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none"
        )
        tokens = (labels != IGNORE_INDEX).sum(dim=1)
        sums = losses.sum(dim=1)
        means.extend((sums / tokens.clamp(min=1)).tolist())
        total, count = total + float(sums.sum()), count + int(tokens.sum())
    model.train(was_training)
    return means, math.exp(total / max(count, 1))


def sequence_wins(baseline: Sequence[float], method: Sequence[float]) -> list[float]:
    """Per sequence: 1 where ``method``'s loss is lower than ``baseline``'s, 0 where higher,
    0.5 for a tie (their mean is the method's win rate, ties split).

    Raises:
        ValueError: lists of different lengths (not the same sequences).
    """
    if len(baseline) != len(method):
        raise ValueError(
            f"{len(baseline)} baseline and {len(method)} method losses; they must score the "
            "same sequences"
        )
    return [
        1.0 if ours < theirs else 0.0 if ours > theirs else 0.5
        for theirs, ours in zip(baseline, method, strict=True)
    ]
