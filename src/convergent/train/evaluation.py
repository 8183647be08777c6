"""Evaluation: loss and task metrics over a dataset (split across processes, or one Transformer
block at a time), and the autocast context of a precision."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from convergent.losses import SCORE_KEYS, summarize_scores, task_scores
from convergent.models.placement import BlockHost, forward_block_by_block
from convergent.train import distributed
from convergent.train.batches import take, trim_padding
from convergent.train.steps import split_batch

__all__ = ["PRECISIONS", "autocast_context", "evaluate", "evaluate_block_by_block"]

PRECISIONS = ("fp32", "bf16", "fp16")


def autocast_context(
    precision: str, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for ``"bf16"``/``"fp16"``, a null context for ``"fp32"``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision 'fp16' needs a CUDA device; use 'bf16' or 'fp32' on CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Dataset[Any],
    task: str,
    batch_size: int = 256,
    precision: str = "fp32",
) -> dict[str, float]:
    """Loss and task metrics over ``dataset``, split across processes and summed exactly."""
    device = distributed.model_device(model)
    was_training = model.training
    model.eval()
    size = len(dataset)  # type: ignore[arg-type]
    rank, world = distributed.rank(), distributed.world_size()
    totals: dict[str, torch.Tensor] = {}
    for start in range(rank * batch_size, size, batch_size * world):
        indices = torch.arange(start, min(start + batch_size, size))
        batch = {k: v.to(device) for k, v in trim_padding(take(dataset, indices)).items()}
        inputs, labels = split_batch(batch)
        with autocast_context(precision, device):
            logits = model(**inputs).logits
        for key, value in task_scores(logits, labels, task).items():
            totals[key] = totals.get(key, torch.zeros((), device=device)) + value.to(device)
    if not totals:  # this rank had no examples; it still takes part in the reductions
        totals = {key: torch.zeros((), device=device) for key in SCORE_KEYS[task]}
    totals = {key: distributed.all_reduce_sum(value) for key, value in totals.items()}
    model.train(was_training)
    return summarize_scores(totals, task)


def evaluate_block_by_block(
    model: nn.Module,
    prefix: str,
    dataset: Dataset[Any],
    task: str,
    batch_size: int,
    device: torch.device,
    host: BlockHost | None = None,
) -> dict[str, float]:
    """:func:`evaluate`'s metrics, computed one Transformer block at a time over every batch
    (:func:`~convergent.models.placement.forward_block_by_block`): for a model whose blocks
    live elsewhere (another device, or its files). One process.

    Args:
        model: the model (its blocks at ``prefix`` may be empty: ``host`` brings them).
        prefix: the name of its block list.
        dataset: the examples (with ``labels``).
        task: as for :func:`evaluate`.
        batch_size: examples per batch.
        device: where to compute.
        host: brings each block to ``device`` (None: it is in memory).
    """
    size = len(dataset)  # type: ignore[arg-type]
    batches = [
        trim_padding(take(dataset, torch.arange(start, min(start + batch_size, size))))
        for start in range(0, size, batch_size)
    ]
    inputs = [split_batch(batch)[0] for batch in batches]
    totals: dict[str, torch.Tensor] = {}
    outputs = forward_block_by_block(model, prefix, inputs, device, host)
    for batch, output in zip(batches, outputs, strict=True):
        for key, value in task_scores(output.logits, batch["labels"].to(device), task).items():
            totals[key] = totals.get(key, torch.zeros((), device=device)) + value
    return summarize_scores(totals, task)
