"""The training runs of the ``sparsity`` study, as functions of plain arguments.

Two experiments: a small ViT-style classifier (our Transformer on image patches) trained
dense or with AC/DC, and a small character-level causal Transformer language model trained
dense and then pruned one-shot. Each optimizer (AdamW, HAM around AdamW, HORST) gets the
same parameter groups: decoupled weight decay on matrices only.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import DictDataset, Splits
from ..models import Transformer, TransformerConfig
from ..optim import HAM, HORST
from ..sparse import ACDCSchedule, perplexity, prune_one_shot, select_prunable
from ..train import ErmStep, evaluate, fit, seed_everything, warmup_schedule
from ..train.masked import MaskedStep

OPTIMIZERS = ("adamw", "ham", "horst")


@dataclass(frozen=True)
class OptimizerSettings:
    """The hyperparameters every run shares, apart from the learning rate."""

    weight_decay: float = 0.05
    horst_alpha: float = 1.0
    horst_beta: float = 0.0
    ham_alpha: float = 200.0
    ham_beta: float = 1e-3


def build_optimizer(
    name: str, model: nn.Module, lr: float, settings: OptimizerSettings
) -> torch.optim.Optimizer:
    """AdamW, HAM(AdamW) or HORST; weight decay on tensors with ndim >= 2 only."""
    decayed = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    plain = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [
        {"params": decayed, "weight_decay": settings.weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    if name == "ham":
        return HAM(torch.optim.AdamW(groups, lr=lr), alpha=settings.ham_alpha,
                   beta=settings.ham_beta)  # fmt: skip
    if name == "horst":
        return HORST(groups, lr=lr, alpha=settings.horst_alpha, beta=settings.horst_beta)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


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


@dataclass(frozen=True)
class Recipe:
    """How every run of one experiment trains: all but the optimizer, lr, seed and target."""

    settings: OptimizerSettings
    shape: dict[str, int]
    steps: int
    batch_size: int


@dataclass
class RunResult:
    """A trained model and what it scored."""

    model: nn.Module
    validation: dict[str, float]
    sparsity: float = 0.0


def train_classifier(
    splits: Splits,
    train_data: Dataset[Any],
    validation_data: Dataset[Any],
    recipe: Recipe,
    optimizer_name: str,
    lr: float,
    seed: int,
    sparsity: float | None = None,
) -> RunResult | None:
    """Train the ViT-style classifier dense (``sparsity=None``) or with AC/DC to ``sparsity``.

    Returns None when the training loss diverged.
    """
    seed_everything(seed)
    model = vision_model(splits, **recipe.shape)
    optimizer = build_optimizer(optimizer_name, model, lr, recipe.settings)
    steps, batch_size = recipe.steps, recipe.batch_size
    scheduler = warmup_schedule(optimizer, steps, max(1, steps // 20), "cosine")
    step: Any = ErmStep("classification")
    if sparsity is not None:
        names = select_prunable(model).names
        step = MaskedStep(step, optimizer, names, sparsity=sparsity,
                          schedule=ACDCSchedule(steps), reset="momentum")  # fmt: skip
    try:
        fit(model, optimizer, train_data, max_steps=steps, batch_size=batch_size,
            task="classification", training_step=step, scheduler=scheduler, seed=seed,
            progress=False, tensorboard=False, log_every=max(steps, 1))  # fmt: skip
    except FloatingPointError:
        return None
    achieved = step.masks.sparsity() if isinstance(step, MaskedStep) and step.masks else 0.0
    return RunResult(model, evaluate(model, validation_data, "classification"), achieved)


def train_language_model(
    splits: Splits,
    train_data: Dataset[Any],
    validation_data: Dataset[Any],
    recipe: Recipe,
    optimizer_name: str,
    lr: float,
    seed: int,
) -> RunResult | None:
    """Train the character language model densely; validation perplexity at the end.

    Returns None when the training loss diverged.
    """
    seed_everything(seed)
    assert splits.vocab_size is not None
    model = language_model(splits.vocab_size, splits.seq_len, **recipe.shape)
    optimizer = build_optimizer(optimizer_name, model, lr, recipe.settings)
    steps, batch_size = recipe.steps, recipe.batch_size
    scheduler = warmup_schedule(optimizer, steps, max(1, steps // 20), "cosine")
    try:
        fit(model, optimizer, train_data, max_steps=steps, batch_size=batch_size, task="lm",
            scheduler=scheduler, seed=seed, progress=False, tensorboard=False,
            log_every=max(steps, 1), grad_clip=1.0)  # fmt: skip
    except FloatingPointError:
        return None
    validation = {"perplexity": dataset_perplexity(model, validation_data)}
    return RunResult(model, validation)


def dataset_perplexity(model: nn.Module, dataset: Dataset[Any], batch_size: int = 128) -> float:
    """Perplexity of ``model`` over a token dataset (``input_ids``, aligned ``labels``)."""
    assert isinstance(dataset, DictDataset)
    tensors = dataset.tensors
    size = len(dataset)
    batches = (
        {key: value[start : start + batch_size] for key, value in tensors.items()}
        for start in range(0, size, batch_size)
    )
    return perplexity(model, batches)


def prune_and_score(
    model: nn.Module, dataset: Dataset[Any], sparsities: tuple[float, ...]
) -> list[dict[str, Any]]:
    """One-shot layer-wise magnitude pruning of a copy of ``model`` at each sparsity."""
    rows = []
    for target in sparsities:
        pruned = copy.deepcopy(model)
        report = prune_one_shot(pruned, target)
        rows.append({"target": target, "sparsity": report.sparsity,
                     "perplexity": dataset_perplexity(pruned, dataset),
                     "excluded": sorted(report.excluded)})  # fmt: skip
    return rows


def prunable_weights(model: nn.Module) -> torch.Tensor:
    """Every prunable weight of ``model``, flattened (for histograms)."""
    parameters = dict(model.named_parameters())
    names = select_prunable(model).names
    return torch.cat([parameters[name].detach().reshape(-1) for name in names])


def concentration(weights: torch.Tensor, threshold: float) -> float:
    """The fraction of ``weights`` with magnitude below ``threshold``."""
    return float((weights.abs() < threshold).float().mean())


def finite_or_nan(value: float) -> float:
    """``value`` if finite, NaN otherwise (a diverged run)."""
    return value if math.isfinite(value) else math.nan
