"""Datasets over dicts of tensors, the ``Splits`` bundle, and seeded index splits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset


class DictDataset(Dataset[dict[str, torch.Tensor]]):
    """A dataset over a dict of equal-length tensors; item i is ``{key: tensor[i]}``, so the
    default collate function turns a list of items into a batch dict."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        lengths = {key: len(value) for key, value in tensors.items()}
        if not lengths or len(set(lengths.values())) != 1:
            raise ValueError(
                f"DictDataset needs at least one tensor, all of one length; got {lengths}."
            )
        self.tensors = dict(tensors)

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[index] for key, value in self.tensors.items()}

    def subset(self, indices: torch.Tensor) -> DictDataset:
        """A new dataset holding the rows ``indices`` (a copy, not a view)."""
        return DictDataset({key: value[indices] for key, value in self.tensors.items()})


@dataclass
class Splits:
    """Train, validation and test sets of one task, plus what a model needs to know.

    Attributes:
        train, validation, test: the three datasets.
        task: "classification", "regression" or "lm".
        num_outputs: classes (classification), target size (regression) or vocabulary (lm).
        seq_len: tokens per example (T).
        vocab_size: the tokenizer's vocabulary size, for token inputs ("input_ids").
        input_dim: features per token (D), for continuous inputs ("inputs").
        info: anything else worth keeping: column names, normalization statistics, the
            time ranges of a chronological split.
    """

    train: DictDataset
    validation: DictDataset
    test: DictDataset
    task: str
    num_outputs: int
    seq_len: int
    vocab_size: int | None = None
    input_dim: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


def split_counts(total: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Sizes of a train/validation/test split: validation and test are rounded down, the
    rest goes to train."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(
            f"Split fractions {fractions} must be three non-negative numbers summing to 1."
        )
    validation = int(total * fractions[1])
    test = int(total * fractions[2])
    return total - validation - test, validation, test


def random_split_indices(
    total: int, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A seeded random permutation of ``range(total)`` cut into train/validation/test.

    The permutation comes from a private ``torch.Generator``, so the global RNG is untouched
    and a seed gives the same split on every machine.
    """
    train, validation, _ = split_counts(total, fractions)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(total, generator=generator)
    return order[:train], order[train : train + validation], order[train + validation :]


def standardize(
    values: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """``(values - mean) / std``, with a zero std treated as 1 (a constant stays 0)."""
    return (values - mean) / torch.where(std > eps, std, torch.ones_like(std))
