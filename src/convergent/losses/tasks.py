"""Each task's loss and scores, next-token labels, and the per-layer losses through a readout.

A task is one of ``"classification"`` (logits ``[B, C]``, integer labels ``[B]``),
``"regression"`` (predictions and targets of the same shape) or ``"lm"`` (logits
``[B, T, V]``, next-token labels ``[B, T]`` with ``-100`` for positions to ignore).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

TASKS = ("classification", "regression", "lm")
IGNORE_INDEX = -100
SCORE_KEYS = {
    "classification": ("loss_sum", "count", "correct"),
    "regression": (
        "loss_sum",
        "count",
        "squared_error_sum",
        "target_squared_sum",
        "element_count",
    ),
    "lm": ("loss_sum", "count", "correct"),
}


def check_task(task: str) -> str:
    """Return ``task`` if it is one we know, else raise a ValueError naming the choices."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return task


def next_token_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Labels aligned with a causal LM's logits: position t holds token t + 1, and
    ``-100`` where the next position is padding or past the end."""
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, IGNORE_INDEX)
    return labels


def task_loss(
    logits: torch.Tensor, labels: torch.Tensor, task: str, reduction: str = "mean"
) -> torch.Tensor:
    """The training loss of ``task``: cross-entropy, mean squared error, or next-token CE.

    Args:
        logits: the model's outputs.
        labels: the targets (see the module docstring for shapes).
        task: ``"classification"``, ``"regression"`` or ``"lm"``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (per example for classification and
            regression, per token for lm).
    """
    check_task(task)
    if task == "classification":
        return F.cross_entropy(logits.float(), labels, reduction=reduction)
    if task == "regression":
        squared = (logits.float() - labels.float()).pow(2)
        if reduction == "none":
            return squared.reshape(squared.shape[0], -1).mean(dim=1)
        return squared.mean() if reduction == "mean" else squared.sum()
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction=reduction,
    )


def task_scores(logits: torch.Tensor, labels: torch.Tensor, task: str) -> dict[str, torch.Tensor]:
    """Summed per-batch scores to aggregate over an evaluation set.

    Returns a dict of 0-d tensors: ``loss_sum`` and ``count``, plus ``correct`` for
    classification and lm, or ``squared_error_sum`` and ``target_squared_sum`` for regression
    (for RMSE and relative L2 error). Sums rather than means so that batches and processes
    combine exactly.
    """
    check_task(task)
    logits = logits.detach()
    if task == "classification":
        return {
            "loss_sum": F.cross_entropy(logits.float(), labels, reduction="sum"),
            "count": torch.tensor(float(labels.numel())),
            "correct": (logits.argmax(dim=-1) == labels).sum().float(),
        }
    if task == "regression":
        error = (logits.float() - labels.float()).pow(2)
        return {
            "loss_sum": error.reshape(error.shape[0], -1).mean(dim=1).sum(),
            "count": torch.tensor(float(labels.shape[0])),
            "squared_error_sum": error.sum(),
            "target_squared_sum": labels.float().pow(2).sum(),
            "element_count": torch.tensor(float(labels.numel())),
        }
    keep = labels != IGNORE_INDEX
    flat_logits = logits.float().reshape(-1, logits.shape[-1])
    return {
        "loss_sum": F.cross_entropy(
            flat_logits, labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        ),
        "count": keep.sum().float(),
        "correct": ((logits.argmax(dim=-1) == labels) & keep).sum().float(),
    }


def summarize_scores(totals: dict[str, torch.Tensor], task: str) -> dict[str, float]:
    """Turn summed :func:`task_scores` into the metrics people read."""
    count = max(float(totals["count"]), 1.0)
    metrics = {"loss": float(totals["loss_sum"]) / count}
    if task in ("classification", "lm"):
        metrics["accuracy"] = float(totals["correct"]) / count
    if task == "lm":
        metrics["perplexity"] = float(torch.exp(torch.tensor(metrics["loss"])))
    if task == "regression":
        elements = max(float(totals["element_count"]), 1.0)
        metrics["rmse"] = (float(totals["squared_error_sum"]) / elements) ** 0.5
        target = max(float(totals["target_squared_sum"]), 1e-30)
        metrics["relative_l2"] = (float(totals["squared_error_sum"]) / target) ** 0.5
    return metrics


def losses_from_hidden_states(
    readout: Any,
    hidden_states: Sequence[torch.Tensor],
    labels: torch.Tensor,
    task: str,
    attention_mask: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
) -> torch.Tensor:
    """Differentiable per-layer losses ``[f_l for l in layers]`` (all L + 1 by default).

    Args:
        readout: the shared head, ``readout(hidden_state, attention_mask) -> logits``.
        hidden_states: L + 1 tensors, the embedding output first.
        labels: the targets, as for the task loss.
        task: ``"classification"``, ``"regression"`` or ``"lm"``.
        attention_mask: padding mask passed to the readout.
        layers: which layer indices to evaluate (e.g. a sampled subset).
    """
    chosen = range(len(hidden_states)) if layers is None else layers
    return torch.stack(
        [task_loss(readout(hidden_states[i], attention_mask), labels, task) for i in chosen]
    )
