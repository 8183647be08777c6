"""Seeded, resumable batches that split one global batch across processes.

The order of examples depends only on ``(seed, epoch)``, and the position inside an epoch
only on the global step, so a run resumed from step ``k`` sees exactly the batches an
uninterrupted run sees from step ``k`` on, and ``n`` processes with ``batch_size / n``
examples each see the same global batch as one process with ``batch_size``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate


def take(dataset: Dataset[Any], indices: torch.Tensor) -> dict[str, torch.Tensor]:
    """The examples at ``indices`` as one batch dict (fast path for tensor-backed datasets)."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, dict):
        return {key: value[indices] for key, value in tensors.items()}
    batch: dict[str, torch.Tensor] = default_collate([dataset[int(i)] for i in indices])
    return batch


def trim_padding(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the columns past the longest ``attention_mask`` in the batch.

    Text is padded to a fixed length when tokenized; cutting the all-padding tail of each
    batch changes no result (padded positions are masked) and saves most of the compute on
    short sentences. Tensors whose first two dimensions match the mask's are cut.
    """
    mask = batch.get("attention_mask")
    if mask is None or mask.ndim != 2:
        return batch
    longest = max(int(mask.sum(dim=1).max()), 1)
    if longest == mask.shape[1]:
        return batch
    return {
        key: value[:, :longest] if value.ndim >= 2 and value.shape[:2] == mask.shape else value
        for key, value in batch.items()
    }


def batches_per_epoch(dataset_size: int, batch_size: int) -> int:
    """Full global batches in one epoch (the last partial batch is dropped)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    if dataset_size < batch_size:
        raise ValueError(
            f"batch_size ({batch_size}) must not exceed the number of training examples"
            f" ({dataset_size})"
        )
    return dataset_size // batch_size


def iterate_batches(
    dataset: Dataset[Any],
    batch_size: int,
    *,
    seed: int,
    start_step: int = 0,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str = "cpu",
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless batches for this process, starting at global step ``start_step``.

    Args:
        dataset: a map-style dataset whose items are dicts of tensors.
        batch_size: the global batch size; must divide evenly by ``world_size``.
        seed: the data-order seed.
        start_step: the global step to start from (for resuming).
        rank: this process's rank.
        world_size: the number of processes.
        device: where batches are moved.
    """
    if batch_size % world_size:
        raise ValueError(
            f"batch_size ({batch_size}) must be divisible by the number of processes ({world_size})"
        )
    size = len(dataset)  # type: ignore[arg-type]
    per_epoch = batches_per_epoch(size, batch_size)
    local = batch_size // world_size
    step = start_step
    while True:
        epoch, position = divmod(step, per_epoch)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(size, generator=generator)
        for index in range(position, per_epoch):
            global_batch = order[index * batch_size : (index + 1) * batch_size]
            mine = global_batch[rank * local : (rank + 1) * local]
            batch = trim_padding(take(dataset, mine))
            yield {key: value.to(device, non_blocking=True) for key, value in batch.items()}
            step += 1


def calibration_batches(
    dataset: Dataset[Any], examples: int, batch_size: int = 16, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """A seeded random sample of ``examples`` examples of ``dataset``, as model-input batches
    (``labels`` dropped, padding columns trimmed): calibration data for one-shot pruning.

    Args:
        dataset: the examples to draw from (a training split, never the data the pruned
            model is then measured on).
        examples: how many, in [1, len(dataset)].
        batch_size: examples per batch, >= 1.
        seed: the sample's seed.
    """
    size = len(dataset)  # type: ignore[arg-type]
    if isinstance(examples, bool) or not isinstance(examples, int) or not 1 <= examples <= size:
        raise ValueError(
            f"calibration examples must be an integer in [1, {size}] (the split's size), "
            f"got {examples!r}"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(size, generator=generator)[:examples].sort().values
    batches = []
    for start in range(0, examples, batch_size):
        batch = trim_padding(take(dataset, chosen[start : start + batch_size]))
        batches.append({key: value for key, value in batch.items() if key != "labels"})
    return batches
