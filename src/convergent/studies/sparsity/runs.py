"""The training runs of the ``sparsity`` study, as functions of plain arguments and jobs.

Two experiments: a small ViT-style classifier (our Transformer on image patches) trained
dense or with AC/DC, and a small character-level causal Transformer language model trained
dense and then pruned one-shot. Every optimizer gets the same parameter groups: decoupled
weight decay on matrices only. HORST runs record how far the mirror step moves the weights
relative to the AdamW step (the study's manipulation check).

A *job* (:class:`VisionJob`, :class:`LanguageJob`) is one run; :func:`vision_unit` and
:func:`language_unit` turn it into what ``torch.load(weights_only=True)`` reads back, for the
resumable unit cache. Jobs are plain values, so a process pool can run them: each process
loads the data once. A selection job (``final=False``) never reads the test split.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from convergent.data import DictDataset, Splits
from convergent.optim import HORST, build_optimizer, decay_groups, horst_move_ratio
from convergent.sparse import ACDCSchedule, perplexity, prune_one_shot
from convergent.studies.sparsity.config import (
    LANGUAGE_MODEL_MASKS,
    RMS_FRACTION,
    VISION_MASKS,
    Config,
    sparsity_key,
)
from convergent.studies.sparsity.models import (
    language_data,
    language_model,
    vision_data,
    vision_model,
)
from convergent.train import ErmStep, MaskedStep, evaluate, fit, seed_everything, warmup_schedule

# The design of this study's units (`UnitCache`), its pilot's too: raise it when this module
# (or another of the study's own) would compute other numbers for the same config; the
# library's numbers are fingerprinted (docs/design.md, "Unit keys").
UNIT_DESIGN = 1

MOVE_RATIO_RECORDS = 20  # move-ratio measurements per HORST run (cheap: no forward pass)
HISTOGRAM_WEIGHTS = 20000  # weights kept per dense model for the histograms


def study_optimizer(
    name: str, model: nn.Module, options: dict[str, float]
) -> torch.optim.Optimizer:
    """AdamW, HAM(AdamW) or HORST with ``options``; weight decay on matrices only."""
    rest = dict(options)
    groups = decay_groups(model, rest.pop("weight_decay"))
    return build_optimizer(name, groups, **rest)


@dataclass(frozen=True)
class Recipe:
    """How every run of one experiment trains: all but the optimizer, options, seed, target."""

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
    """Records :func:`~convergent.optim.horst_move_ratio` every ``every`` steps of a fit.

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


def _fit(
    model: nn.Module, optimizer: Any, data: Any, recipe: Recipe, seed: int, **kw: Any
) -> tuple[bool, float | None]:
    """:func:`fit` with the study's schedule (5 % warm-up, cosine): whether it finished (False:
    the loss diverged) and HORST's mean move ratio (None for the other optimizers)."""
    scheduler = warmup_schedule(optimizer, recipe.steps, max(1, recipe.steps // 20), "cosine")
    recorders = _recorders(optimizer, recipe.steps)
    try:
        fit(
            model,
            optimizer,
            data,
            max_steps=recipe.steps,
            batch_size=recipe.batch_size,
            scheduler=scheduler,
            seed=seed,
            progress=False,
            tensorboard=False,
            log_every=max(recipe.steps, 1),
            callbacks=recorders,
            **kw,
        )
    except FloatingPointError:
        return False, None
    return True, recorders[0].mean if recorders else None


def train_classifier(
    splits: Splits,
    train_data: Dataset[Any],
    validation_data: Dataset[Any],
    recipe: Recipe,
    optimizer_name: str,
    options: dict[str, float],
    seed: int,
    sparsity: float | None,
    distribution: str,
) -> RunResult | None:
    """Train the ViT-style classifier dense (``sparsity=None``) or with AC/DC to ``sparsity``
    (``distribution``: global or uniform, layer-wise, magnitude masks).

    Returns None when the training loss diverged.
    """
    seed_everything(seed)
    model = vision_model(splits, **recipe.shape)
    optimizer = study_optimizer(optimizer_name, model, options)
    step: Any = ErmStep("classification")
    if sparsity is not None:
        names = VISION_MASKS.select(model).names
        schedule = ACDCSchedule(recipe.steps)
        step = MaskedStep(
            step,
            optimizer,
            names,
            sparsity=sparsity,
            schedule=schedule,
            spec=VISION_MASKS.replace(distribution=distribution),
        )
    finished, move = _fit(
        model, optimizer, train_data, recipe, seed, task="classification", training_step=step
    )
    if not finished:
        return None
    achieved = step.masks.sparsity() if isinstance(step, MaskedStep) and step.masks else 0.0
    validation = evaluate(model, validation_data, "classification")
    if not math.isfinite(validation["loss"]):
        return None
    return RunResult(model, validation, achieved, move)


def train_language_model(
    splits: Splits,
    train_data: Dataset[Any],
    recipe: Recipe,
    optimizer_name: str,
    options: dict[str, float],
    seed: int,
) -> tuple[nn.Module, float | None] | None:
    """Train the character language model densely: (model, move ratio); None if it diverged."""
    seed_everything(seed)
    assert splits.vocab_size is not None
    model = language_model(splits.vocab_size, splits.seq_len, **recipe.shape)
    optimizer = study_optimizer(optimizer_name, model, options)
    finished, move = _fit(model, optimizer, train_data, recipe, seed, task="lm", grad_clip=1.0)
    return (model, move) if finished else None


def dataset_perplexity(model: nn.Module, dataset: Dataset[Any], batch_size: int = 128) -> float:
    """Perplexity of ``model`` over a token dataset (``input_ids``, aligned ``labels``)."""
    assert isinstance(dataset, DictDataset)
    tensors = dataset.tensors
    batches = (
        {key: value[start : start + batch_size] for key, value in tensors.items()}
        for start in range(0, len(dataset), batch_size)
    )
    return perplexity(model, batches)


def pruned_perplexities(
    model: nn.Module, dataset: Dataset[Any], sparsities: tuple[float, ...]
) -> dict[str, float]:
    """``{"0%": dense, "50%": ...}``: perplexity after one-shot layer-wise magnitude pruning of a
    copy of ``model`` at each sparsity."""
    scores = {"0%": dataset_perplexity(model, dataset)}
    for target in sparsities:
        pruned = copy.deepcopy(model)
        prune_one_shot(pruned, target, spec=LANGUAGE_MODEL_MASKS)
        scores[sparsity_key(target)] = dataset_perplexity(pruned, dataset)
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


def _finite_or_nan(value: float | None) -> float | None:
    return None if value is None else (value if math.isfinite(value) else math.nan)


@dataclass(frozen=True)
class VisionJob:
    """One classifier run: ``final`` runs are scored on test, selection runs never read it."""

    config: Config
    optimizer: str
    point: dict[str, float]
    seed: int
    sparsity: float | None
    final: bool

    def unit(self) -> dict[str, Any]:
        """The unit-cache key of this run."""
        return {
            "part": "vit",
            "optimizer": self.optimizer,
            **self.point,
            "seed": self.seed,
            "sparsity": self.sparsity,
            "final": self.final,
        }


@dataclass(frozen=True)
class LanguageJob:
    """One language-model run: ``final`` runs are scored on test windows."""

    config: Config
    optimizer: str
    point: dict[str, float]
    seed: int
    final: bool

    def unit(self) -> dict[str, Any]:
        """The unit-cache key of this run."""
        return {
            "part": "lm",
            "optimizer": self.optimizer,
            **self.point,
            "seed": self.seed,
            "final": self.final,
        }


def vision_unit(job: VisionJob) -> dict[str, Any]:
    """Run a :class:`VisionJob`: validation accuracy, achieved sparsity, the move ratio (HORST),
    and for final runs the test accuracy; dense final runs also the near-zero share and a
    histogram sample. NaN for a run that diverged."""
    config = job.config
    torch.set_num_threads(config.threads)
    splits, train, validation, test = vision_data(
        config.image_size,
        config.patch,
        config.train_examples,
        config.validation_examples,
        config.test_examples,
    )
    shape = {
        "d_model": config.vit_d_model,
        "n_layers": config.vit_layers,
        "n_heads": config.vit_heads,
        "d_ff": config.vit_d_ff,
    }
    recipe = Recipe(shape, config.vit_steps, config.vit_batch_size)
    options = config.options(job.optimizer, job.point)
    result = train_classifier(
        splits,
        train,
        validation,
        recipe,
        job.optimizer,
        options,
        job.seed,
        job.sparsity,
        config.acdc_distribution,
    )
    unit: dict[str, Any] = {
        "validation_accuracy": result.validation["accuracy"] if result else math.nan,
        "achieved_sparsity": result.sparsity if result else math.nan,
        "move_ratio": (
            (_finite_or_nan(result.move_ratio) if result else math.nan)
            if job.optimizer == "horst"
            else None
        ),
    }
    if job.final:
        unit["test_accuracy"] = (
            evaluate(result.model, test, "classification")["accuracy"] if result else math.nan
        )
        if job.sparsity is None:
            weights = prunable_weights(result.model) if result else None
            unit["near_zero_share"] = near_zero_share(weights) if weights else math.nan
            unit["histogram"] = histogram_sample(weights) if weights else None
    return unit


def language_unit(job: LanguageJob) -> dict[str, Any]:
    """Run a :class:`LanguageJob`: perplexity dense and after one-shot pruning at each target
    (validation for selection runs, test windows for final ones), the move ratio (HORST) and,
    for final runs, the near-zero share and a histogram sample."""
    config = job.config
    torch.set_num_threads(config.threads)
    splits, validation, test = language_data(
        config.lm_seq_len, config.lm_validation_windows, config.lm_test_windows
    )
    shape = {
        "d_model": config.lm_d_model,
        "n_layers": config.lm_layers,
        "n_heads": config.lm_heads,
        "d_ff": config.lm_d_ff,
    }
    recipe = Recipe(shape, config.lm_steps, config.lm_batch_size)
    options = config.options(job.optimizer, job.point)
    trained = train_language_model(splits, splits.train, recipe, job.optimizer, options, job.seed)
    keys = ["0%", *(sparsity_key(t) for t in config.lm_sparsities)]
    scored = test if job.final else validation
    unit: dict[str, Any] = {
        "split": "test" if job.final else "validation",
        "perplexity": (
            pruned_perplexities(trained[0], scored, config.lm_sparsities)
            if trained
            else dict.fromkeys(keys, math.nan)
        ),
        "move_ratio": (
            (_finite_or_nan(trained[1]) if trained else math.nan)
            if job.optimizer == "horst"
            else None
        ),
    }
    if job.final:
        weights = prunable_weights(trained[0]) if trained else None
        unit["near_zero_share"] = near_zero_share(weights) if weights else math.nan
        unit["histogram"] = histogram_sample(weights) if weights else None
    return unit
