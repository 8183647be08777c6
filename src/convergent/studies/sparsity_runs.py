"""The training runs of the ``sparsity`` study, as functions of plain arguments.

Two experiments: a small ViT-style classifier (our Transformer on image patches) trained
dense or with AC/DC, and a small character-level causal Transformer language model trained
dense and then pruned one-shot. Each optimizer (AdamW, HAM around AdamW, HORST) gets the
same parameter groups: decoupled weight decay on matrices only. HORST runs record how far the
mirror step moves the weights relative to the AdamW step (the study's manipulation check).

A *unit* (:func:`classifier_unit`, :func:`language_model_unit`) is one run turned into what
``torch.load(weights_only=True)`` reads back, for the study's resumable unit cache.
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
from ..optim import HORST, build_optimizer, decay_groups, horst_move_ratio
from ..sparse import ACDCSchedule, perplexity, prune_one_shot, select_prunable
from ..train import ErmStep, evaluate, fit, seed_everything, warmup_schedule
from ..train.masked import MaskedStep
from .sparsity_models import language_model, vision_model

OPTIMIZERS = ("adamw", "ham", "horst")
MOVE_RATIO_RECORDS = 20  # move-ratio measurements per HORST run (cheap: no forward pass)


@dataclass(frozen=True)
class OptimizerSettings:
    """The hyperparameters every run shares, apart from the learning rate (the study's own
    declared values: see ``sparsity.Config``)."""

    weight_decay: float
    horst_alpha: float
    horst_beta: float
    ham_alpha: float
    ham_beta: float

    def options(self, name: str) -> dict[str, float]:
        """The mirror options of optimizer ``name`` (none for AdamW)."""
        if name == "horst":
            return {"alpha": self.horst_alpha, "beta": self.horst_beta}
        if name == "ham":
            return {"alpha": self.ham_alpha, "beta": self.ham_beta}
        return {}


def study_optimizer(
    name: str, model: nn.Module, lr: float, settings: OptimizerSettings
) -> torch.optim.Optimizer:
    """AdamW, HAM(AdamW) or HORST; weight decay on tensors with ndim >= 2 only."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    groups = decay_groups(model, settings.weight_decay)
    return build_optimizer(name, groups, lr=lr, **settings.options(name))


@dataclass(frozen=True)
class Recipe:
    """How every run of one experiment trains: all but the optimizer, lr, seed and target."""

    settings: OptimizerSettings
    shape: dict[str, int]
    steps: int
    batch_size: int


@dataclass
class RunResult:
    """A trained model and what it scored.

    Attributes:
        model: the trained model.
        validation: its validation metrics.
        sparsity: the sparsity of its final masks (0 for dense training).
        move_ratio: HORST's mirror move / Adam move, mean over the recorded steps (None for
            the other optimizers).
    """

    model: nn.Module
    validation: dict[str, float]
    sparsity: float = 0.0
    move_ratio: float | None = None


class MoveRatioRecorder:
    """A ``fit`` callback: :func:`~convergent.optim.horst_move_ratio` every ``every`` steps.

    Args:
        optimizer: the HORST optimizer of the run.
        every: record after every this many optimizer steps.
    """

    def __init__(self, optimizer: HORST, every: int) -> None:
        self.optimizer = optimizer
        self.every = max(1, every)
        self.values: list[float] = []

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        if step % self.every == 0:
            self.values.append(horst_move_ratio(self.optimizer))

    @property
    def mean(self) -> float:
        """The mean of the finite records (the last step's lr of 0 gives NaN); NaN if none."""
        finite = [v for v in self.values if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else math.nan


def _recorders(optimizer: torch.optim.Optimizer, steps: int) -> list[MoveRatioRecorder]:
    if isinstance(optimizer, HORST):
        return [MoveRatioRecorder(optimizer, steps // MOVE_RATIO_RECORDS)]
    return []


def _move_ratio(recorders: list[MoveRatioRecorder]) -> float | None:
    return recorders[0].mean if recorders else None


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
    optimizer = study_optimizer(optimizer_name, model, lr, recipe.settings)
    steps, batch_size = recipe.steps, recipe.batch_size
    scheduler = warmup_schedule(optimizer, steps, max(1, steps // 20), "cosine")
    step: Any = ErmStep("classification")
    if sparsity is not None:
        names = select_prunable(model).names
        step = MaskedStep(
            step,
            optimizer,
            names,
            sparsity=sparsity,
            schedule=ACDCSchedule(steps),
            reset="momentum",
        )
    recorders = _recorders(optimizer, steps)
    try:
        fit(
            model,
            optimizer,
            train_data,
            max_steps=steps,
            batch_size=batch_size,
            task="classification",
            training_step=step,
            scheduler=scheduler,
            seed=seed,
            progress=False,
            tensorboard=False,
            log_every=max(steps, 1),
            callbacks=recorders,
        )
    except FloatingPointError:
        return None
    achieved = step.masks.sparsity() if isinstance(step, MaskedStep) and step.masks else 0.0
    validation = evaluate(model, validation_data, "classification")
    return RunResult(model, validation, achieved, _move_ratio(recorders))


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
    optimizer = study_optimizer(optimizer_name, model, lr, recipe.settings)
    steps, batch_size = recipe.steps, recipe.batch_size
    scheduler = warmup_schedule(optimizer, steps, max(1, steps // 20), "cosine")
    recorders = _recorders(optimizer, steps)
    try:
        fit(
            model,
            optimizer,
            train_data,
            max_steps=steps,
            batch_size=batch_size,
            task="lm",
            scheduler=scheduler,
            seed=seed,
            progress=False,
            tensorboard=False,
            log_every=max(steps, 1),
            grad_clip=1.0,
            callbacks=recorders,
        )
    except FloatingPointError:
        return None
    validation = {"perplexity": dataset_perplexity(model, validation_data)}
    return RunResult(model, validation, move_ratio=_move_ratio(recorders))


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
        rows.append(
            {
                "target": target,
                "sparsity": report.sparsity,
                "perplexity": dataset_perplexity(pruned, dataset),
                "excluded": sorted(report.excluded),
            }
        )
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


def _nan_if_none(value: float | None) -> float | None:
    return None if value is None else finite_or_nan(float(value))


def classifier_unit(
    splits: Splits,
    train_data: Dataset[Any],
    validation_data: Dataset[Any],
    test_data: Dataset[Any] | None,
    recipe: Recipe,
    optimizer_name: str,
    lr: float,
    seed: int,
    sparsity: float | None = None,
) -> dict[str, Any]:
    """One classifier run (:func:`train_classifier`) as plain values for the unit cache.

    Dense runs are also the learning-rate sweep's grid points, so they never read the test
    split (pass ``test_data=None``): they keep the model's state, and the study scores the
    selected models on test once. AC/DC runs are final models: their test accuracy is
    measured here.

    Returns:
        ``validation_accuracy``, ``achieved_sparsity``, ``move_ratio`` (None but for HORST),
        and ``state`` (dense: the model's state dict) or ``test_accuracy`` (AC/DC); NaN (and
        a state of None) for a run that diverged.
    """
    if sparsity is not None and test_data is None:
        raise ValueError("an AC/DC run is a final model and needs the test split")
    result = train_classifier(
        splits, train_data, validation_data, recipe, optimizer_name, lr, seed, sparsity
    )
    unit: dict[str, Any] = {
        "validation_accuracy": result.validation["accuracy"] if result else math.nan,
        "achieved_sparsity": result.sparsity if result else math.nan,
        "move_ratio": _nan_if_none(result.move_ratio) if result else math.nan,
    }
    if optimizer_name != "horst":
        unit["move_ratio"] = None
    if sparsity is None:
        unit["state"] = (
            {k: v.detach().clone() for k, v in result.model.state_dict().items()}
            if result
            else None
        )
    else:
        assert test_data is not None
        unit["test_accuracy"] = (
            evaluate(result.model, test_data, "classification")["accuracy"] if result else math.nan
        )
    return unit


def restore_classifier(
    splits: Splits, shape: dict[str, int], state: dict[str, torch.Tensor]
) -> nn.Module:
    """The classifier of a dense unit, rebuilt from its stored state."""
    model = vision_model(splits, **shape)
    model.load_state_dict(state)
    return model


def language_model_unit(
    splits: Splits,
    train_data: Dataset[Any],
    validation_data: Dataset[Any],
    recipe: Recipe,
    optimizer_name: str,
    lr: float,
    seed: int,
    sparsities: tuple[float, ...],
    near_zero: float,
) -> dict[str, Any]:
    """One dense language-model run, pruned one-shot at each of ``sparsities``, as plain values.

    Returns:
        ``validation_perplexity``, ``pruned_perplexity`` (``{"90%": perplexity}``),
        ``near_zero_fraction`` (prunable weights of magnitude below ``near_zero``),
        ``move_ratio`` (None but for HORST) and ``weights`` (the prunable weights, flat, for
        the histogram); NaN (weights None) for a run that diverged.
    """
    result = train_language_model(
        splits, train_data, validation_data, recipe, optimizer_name, lr, seed
    )
    if result is None:
        return {
            "validation_perplexity": math.nan,
            "pruned_perplexity": {f"{round(t * 100)}%": math.nan for t in sparsities},
            "near_zero_fraction": math.nan,
            "move_ratio": math.nan if optimizer_name == "horst" else None,
            "weights": None,
        }
    weights = prunable_weights(result.model).clone()
    return {
        "validation_perplexity": result.validation["perplexity"],
        "pruned_perplexity": {
            f"{round(row['target'] * 100)}%": row["perplexity"]
            for row in prune_and_score(result.model, validation_data, sparsities)
        },
        "near_zero_fraction": concentration(weights, near_zero),
        "move_ratio": _nan_if_none(result.move_ratio),
        "weights": weights,
    }
