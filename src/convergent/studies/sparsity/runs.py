"""The training runs of the ``sparsity`` study, as functions of plain arguments and jobs.

Two experiments: a small ViT-style classifier (our Transformer on image patches) trained
dense or with AC/DC, and a small character-level causal Transformer language model trained
dense and then pruned one-shot by each of ``Config.lm_pruners`` (magnitude, Wanda, SparseGPT;
the calibrated two read a fixed draw of training windows). Every optimizer gets the same
parameter groups: decoupled weight decay on matrices only. HORST and HAM runs record how far
their mirror step moves the weights relative to their AdamW step (the study's manipulation
checks), and HORST runs their first-order strength, alpha x mean |theta| at initialization
(the ``strength`` that ``HORST(strength=...)`` takes).

Every LM unit, selection or final, is scored with every pruner: the selection reads magnitude
pruning only, and the other pruners' validation perplexities of the grid points cost seconds
against minutes of training, and show whether a pruner would have selected differently.

A run is a unit of the engine (:func:`vision_run`, :func:`language_run`): :func:`vision_unit`
and :func:`language_unit` compute what ``torch.load(weights_only=True)`` reads back, from plain
arguments, so a process pool can run them: each process loads the data once. A selection run
(``final=False``) never reads the test split.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from convergent.data import Splits
from convergent.optim import (
    HAM,
    HORST,
    MirrorCheck,
    build_optimizer,
    decay_groups,
    horst_strength,
)
from convergent.sparse import ACDCSchedule
from convergent.studies.engine import Unit, training_key
from convergent.studies.sparsity.config import (
    VISION_MASKS,
    Config,
    sparsity_key,
)
from convergent.studies.sparsity.measures import (
    calibration_batches,
    histogram_sample,
    near_zero_share,
    prunable_weights,
    pruned_perplexities,
)
from convergent.studies.sparsity.models import (
    language_data,
    language_model,
    vision_data,
    vision_model,
)
from convergent.train import ErmStep, MaskedStep, evaluate, fit, seed_everything, warmup_schedule

# The design of this study's units (`UnitCache`; the pilot keeps its own,
# `pilot.PILOT_UNIT_DESIGN`): raise it when this module (or another of the study's own) would
# compute other numbers for the same config; the library's numbers are fingerprinted
# (docs/design.md, "Unit keys"). Design 2: HAM's move ratio, HORST's strength and the LM's
# Wanda and SparseGPT perplexities.
UNIT_DESIGN = 2

MOVE_RATIO_RECORDS = 20  # move-ratio measurements per HORST or HAM run (no forward pass)


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
        move_ratio: HORST's or HAM's mirror move / AdamW move, mean over the recorded steps
            (None for AdamW).
        strength: HORST's alpha x mean |theta| at initialization (None for the others).
    """

    model: nn.Module
    validation: dict[str, float]
    sparsity: float = 0.0
    move_ratio: float | None = None
    strength: float | None = None


class MoveRatioRecorder:
    """Records the mirror/AdamW move ratio every ``every`` steps of a fit, as the run's own
    manipulation check reads it (:class:`~convergent.optim.MirrorCheck`:
    :func:`~convergent.optim.horst_move_ratio` for HORST, :func:`~convergent.optim.ham_move_ratio`
    for HAM, which reads the step's gradient, still there when a step ends).

    Args:
        optimizer: the HORST or HAM optimizer of the run.
        every: record after every this many optimizer steps.
    """

    def __init__(self, optimizer: HORST | HAM, every: int) -> None:
        self.check = MirrorCheck(optimizer)
        self.every = max(1, every)
        self.values: list[float] = []

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        if step % self.every == 0:
            self.values.append(self.check.move_ratio())

    @property
    def mean(self) -> float:
        """The mean of the finite records (the last step's lr of 0 gives NaN); NaN if none."""
        finite = [v for v in self.values if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else math.nan


def _recorders(
    optimizer: torch.optim.Optimizer, steps: int, records: int = MOVE_RATIO_RECORDS
) -> list[MoveRatioRecorder]:
    if isinstance(optimizer, HORST | HAM):
        return [MoveRatioRecorder(optimizer, steps // records)]
    return []


def initial_strength(optimizer: torch.optim.Optimizer) -> float | None:
    """HORST's first-order strength before its first step: alpha x mean |theta| over the
    mirrored tensors (every group's, weighted by its mirrored elements), the ``strength`` that
    ``HORST(strength=...)`` would set this alpha from; None for the other optimizers."""
    if not isinstance(optimizer, HORST):
        return None
    rows = [
        row
        for row in horst_strength(optimizer)
        if row["mirrored"] > 0 and math.isfinite(row["alpha_times_mean_abs"])
    ]
    weight = sum(row["mirrored"] for row in rows)
    if not weight:
        return math.nan
    return sum(row["alpha_times_mean_abs"] * row["mirrored"] for row in rows) / weight


def fit_recipe(
    model: nn.Module,
    optimizer: Any,
    data: Any,
    recipe: Recipe,
    seed: int,
    records: int = MOVE_RATIO_RECORDS,
    **kw: Any,
) -> tuple[bool, float | None]:
    """:func:`fit` with the study's schedule (5 % warm-up, cosine): whether it finished (False:
    the loss diverged) and HORST's or HAM's mean move ratio (None for AdamW) over ``records``
    readings, evenly spaced (every ``steps // records`` steps)."""
    scheduler = warmup_schedule(optimizer, recipe.steps, max(1, recipe.steps // 20), "cosine")
    recorders = _recorders(optimizer, recipe.steps, records)
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
    strength = initial_strength(optimizer)
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
    finished, move = fit_recipe(
        model, optimizer, train_data, recipe, seed, task="classification", training_step=step
    )
    if not finished:
        return None
    achieved = step.masks.sparsity() if isinstance(step, MaskedStep) and step.masks else 0.0
    validation = evaluate(model, validation_data, "classification")
    if not math.isfinite(validation["loss"]):
        return None
    return RunResult(model, validation, achieved, move, strength)


def train_language_model(
    splits: Splits,
    train_data: Dataset[Any],
    recipe: Recipe,
    optimizer_name: str,
    options: dict[str, float],
    seed: int,
) -> RunResult | None:
    """Train the character language model densely (no validation scores yet: the caller
    prunes and scores it); None if it diverged."""
    seed_everything(seed)
    assert splits.vocab_size is not None
    model = language_model(splits.vocab_size, splits.seq_len, **recipe.shape)
    optimizer = study_optimizer(optimizer_name, model, options)
    strength = initial_strength(optimizer)
    finished, move = fit_recipe(
        model, optimizer, train_data, recipe, seed, task="lm", grad_clip=1.0
    )
    return RunResult(model, {}, 0.0, move, strength) if finished else None


def _finite_or_nan(value: float | None) -> float | None:
    return None if value is None else (value if math.isfinite(value) else math.nan)


def vision_run(
    config: Config,
    optimizer: str,
    point: dict[str, float],
    seed: int,
    sparsity: float | None,
    final: bool,
    compute: Callable[..., dict[str, Any]] | None = None,
) -> Unit:
    """One classifier run as a unit (`vision_unit`, or ``compute`` with the same arguments):
    ``final`` runs are scored on test, selection runs never read it."""
    key = training_key("vit", point, seed, final, optimizer=optimizer, sparsity=sparsity)
    arguments = (config, optimizer, point, seed, sparsity, final)
    return Unit(key, compute or vision_unit, arguments)


def language_run(
    config: Config, optimizer: str, point: dict[str, float], seed: int, final: bool
) -> Unit:
    """One language-model run as a unit (`language_unit`): ``final`` runs are scored on test
    windows."""
    key = training_key("lm", point, seed, final, optimizer=optimizer)
    return Unit(key, language_unit, (config, optimizer, point, seed, final))


def _mirror_numbers(optimizer: str, result: RunResult | None) -> dict[str, float | None]:
    """The unit's ``move_ratio`` (HORST, HAM) and ``strength`` (HORST); None where the
    optimizer has none, NaN for a run that diverged."""
    return {
        "move_ratio": (
            (_finite_or_nan(result.move_ratio) if result else math.nan)
            if optimizer in ("horst", "ham")
            else None
        ),
        "strength": (
            (_finite_or_nan(result.strength) if result else math.nan)
            if optimizer == "horst"
            else None
        ),
    }


def vision_unit(
    config: Config,
    optimizer: str,
    point: dict[str, float],
    seed: int,
    sparsity: float | None,
    final: bool,
) -> dict[str, Any]:
    """One classifier run (`vision_run`): validation accuracy, achieved sparsity, the move ratio
    (HORST, HAM) and the strength (HORST), and for final runs the test accuracy; dense final
    runs also the near-zero share and a histogram sample. NaN for a run that diverged."""
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
    options = config.options(optimizer, point)
    result = train_classifier(
        splits,
        train,
        validation,
        recipe,
        optimizer,
        options,
        seed,
        sparsity,
        config.acdc_distribution,
    )
    unit: dict[str, Any] = {
        "validation_accuracy": result.validation["accuracy"] if result else math.nan,
        "achieved_sparsity": result.sparsity if result else math.nan,
        **_mirror_numbers(optimizer, result),
    }
    if final:
        unit["test_accuracy"] = (
            evaluate(result.model, test, "classification")["accuracy"] if result else math.nan
        )
        if sparsity is None:
            weights = prunable_weights(result.model) if result else None
            unit["near_zero_share"] = near_zero_share(weights) if weights else math.nan
            unit["histogram"] = histogram_sample(weights) if weights else None
    return unit


def language_unit(
    config: Config, optimizer: str, point: dict[str, float], seed: int, final: bool
) -> dict[str, Any]:
    """One language-model run (`language_run`): perplexity dense and after one-shot pruning by each pruner at
    each target (``{pruner: {"0%": ..., "90%": ...}}``; validation for selection runs, test
    windows for final ones), the move ratio and strength (HORST) and, for final runs, the
    near-zero share and a histogram sample."""
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
    options = config.options(optimizer, point)
    trained = train_language_model(splits, splits.train, recipe, optimizer, options, seed)
    keys = ["0%", *(sparsity_key(t) for t in config.lm_sparsities)]
    scored = test if final else validation
    perplexities = (
        pruned_perplexities(
            trained.model,
            scored,
            config.lm_sparsities,
            config.lm_pruners,
            calibration_batches(splits.train, config.lm_calibration_windows),
        )
        if trained
        else {pruner: dict.fromkeys(keys, math.nan) for pruner in config.lm_pruners}
    )
    unit: dict[str, Any] = {
        "split": "test" if final else "validation",
        "perplexity": perplexities,
        **_mirror_numbers(optimizer, trained),
    }
    if final:
        weights = prunable_weights(trained.model) if trained else None
        unit["near_zero_share"] = near_zero_share(weights) if weights else math.nan
        unit["histogram"] = histogram_sample(weights) if weights else None
    return unit
