"""The models and data of the ``sparsity`` study: the ViT-style classifier on Fashion-MNIST
patches, the character language model on Austen, and the subsets each part reads."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from convergent.data import DictDataset, Splits, load_splits
from convergent.models import Transformer, TransformerConfig


def subset(dataset: Dataset[Any], count: int | None, seed: int = 0) -> DictDataset:
    """The first ``count`` examples of a seeded shuffle (all of them for None)."""
    assert isinstance(dataset, DictDataset)
    size = len(dataset)
    if count is None or count >= size:
        return dataset
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:count]
    return dataset.subset(order)


def vision_model(splits: Splits, d_model: int, n_layers: int, n_heads: int, d_ff: int) -> nn.Module:
    """A ViT-style classifier: patches -> linear patch embedding -> encoder -> mean pool."""
    return Transformer(
        TransformerConfig(
            task="classification",
            num_outputs=splits.num_outputs,
            input_dim=splits.input_dim,
            max_len=splits.seq_len,
            d_model=d_model,
            n_heads=n_heads,
            n_layers=n_layers,
            d_ff=d_ff,
            pooling="mean",
        )
    )


def language_model(
    vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int, d_ff: int
) -> nn.Module:
    """A small causal character-level Transformer."""
    return Transformer(
        TransformerConfig(
            task="lm",
            vocab_size=vocab_size,
            max_len=seq_len,
            d_model=d_model,
            n_heads=n_heads,
            n_layers=n_layers,
            d_ff=d_ff,
            causal=True,
        )
    )


@functools.lru_cache(maxsize=2)
def vision_data(
    size: int, patch: int, train: int | None, validation: int | None, test: int | None
) -> tuple[Splits, Any, Any, Any]:
    """Fashion-MNIST patches and the study's subsets (loaded once per process)."""
    splits = load_splits("fashion-mnist", seed=0, size=size, patch=patch)
    return (
        splits,
        subset(splits.train, train),
        subset(splits.validation, validation),
        subset(splits.test, test),
    )


@functools.lru_cache(maxsize=2)
def language_data(
    seq_len: int, validation: int | None, test: int | None
) -> tuple[Splits, Any, Any]:
    """Austen character windows and the study's subsets (loaded once per process)."""
    splits = load_splits("austen", seq_len=seq_len)
    return splits, subset(splits.validation, validation), subset(splits.test, test)
