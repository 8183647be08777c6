"""Study ``sparsity``: does HORST train weights that survive pruning (Jacobs, Jain, Burkholz, 2026)?

Claims: at high sparsity (80-90 %) models trained with HORST lose far less accuracy than with
AdamW, and less than with HAM; HORST's weights concentrate near zero.

(a) A small ViT-style classifier (our Transformer on image patches) on Fashion-MNIST, trained
    with AC/DC (global magnitude, straight to the target at each compression) at each target
    sparsity, and dense, with AdamW, HAM (around AdamW) and HORST over the same seeds; top-1
    test accuracy of the final sparse model against the dense baseline.
(b) A small character-level causal Transformer on Jane Austen's novels, trained densely with
    each optimizer, then pruned one-shot layer-wise by magnitude at 50-90 %; validation
    perplexity before and after.

Every optimizer gets the same small learning-rate sweep (dense training, first seed, best
validation score; the test split is not read while tuning), and the grids are reported. The
claims are scored from the stored data alone (:mod:`.sparsity_claims`): one paired effect per
seed, a t-interval over seeds, and a manipulation check that HORST's mirror step moved the
weights. Every (configuration, seed) run goes through a unit cache in ``OUT/units``, so an
interrupted run resumes where it stopped.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..data import Splits, load_splits
from ..train import evaluate
from .common import StudyResult, check_mode, json_ready
from .sparsity_claims import (
    LANGUAGE_CRITERION,
    LANGUAGE_TUNING,
    VISION_CRITERION,
    VISION_TUNING,
    claims_from_results,
    tuning_from_results,
)
from .sparsity_claims import sparsity_key as _key
from .sparsity_plots import plot_histograms, plot_sparsity_curves
from .sparsity_runs import (
    OPTIMIZERS,
    OptimizerSettings,
    Recipe,
    classifier_unit,
    language_model_unit,
    prunable_weights,
    restore_classifier,
    subset,
)
from .tuning import Tuning, TuningData, tune
from .units import UnitCache

__all__ = ["NEAR_ZERO", "Config", "claims_from_results", "run", "tuning_from_results"]

NEAR_ZERO = 1e-3  # |w| below this counts as "near zero" (weights start at std 0.02)


@dataclass(frozen=True)
class Config:
    """The ``sparsity`` study's settings.

    Attributes:
        mode: ``smoke``, ``quick`` or ``full``.
        seeds: seeds of every run (the lr sweep uses the first).
        optimizers: among ``adamw``, ``ham``, ``horst``.
        learning_rates: the sweep, the same for each optimizer.
        sparsities: AC/DC targets for the classifier.
        lm_sparsities: one-shot targets for the language model.
        image_size, patch: Fashion-MNIST resized to ``image_size`` and cut into patches.
        vit_d_model, vit_layers, vit_heads, vit_d_ff: the classifier's shape.
        vit_steps, vit_batch_size: classifier training.
        train_examples: training images used (None: all 55,000).
        validation_examples, test_examples: evaluation subsets (None: all).
        lm_seq_len, lm_d_model, lm_layers, lm_heads, lm_d_ff: the language model.
        lm_steps, lm_batch_size: language-model training.
        lm_validation_windows: validation windows scored for perplexity (None: all).
        weight_decay, horst_alpha, horst_beta, ham_alpha, ham_beta: shared hyperparameters.
        threads: torch threads during the run (restored after); None leaves them alone. The
            models are tiny: one thread is as fast as two, and much faster on a busy machine.
    """

    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    optimizers: tuple[str, ...] = OPTIMIZERS
    learning_rates: tuple[float, ...] = (1e-3, 3e-3)
    sparsities: tuple[float, ...] = (0.7, 0.8, 0.9)
    lm_sparsities: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    image_size: int = 14
    patch: int = 7
    vit_d_model: int = 64
    vit_layers: int = 2
    vit_heads: int = 4
    vit_d_ff: int = 128
    vit_steps: int = 300
    vit_batch_size: int = 128
    train_examples: int | None = None
    validation_examples: int | None = 2000
    test_examples: int | None = 5000
    lm_seq_len: int = 64
    lm_d_model: int = 64
    lm_layers: int = 2
    lm_heads: int = 4
    lm_d_ff: int = 128
    lm_steps: int = 300
    lm_batch_size: int = 32
    lm_validation_windows: int | None = 256
    weight_decay: float = 0.05
    horst_alpha: float = 1.0
    horst_beta: float = 0.0
    ham_alpha: float = 200.0
    ham_beta: float = 1e-3
    threads: int | None = 1

    def __post_init__(self) -> None:
        check_mode(self.mode)
        unknown = sorted(set(self.optimizers) - set(OPTIMIZERS))
        if unknown:
            raise ValueError(f"optimizers must be among {', '.join(OPTIMIZERS)}, got {unknown}")
        for value in (*self.sparsities, *self.lm_sparsities):
            if not 0.0 < value < 1.0:
                raise ValueError(f"every sparsity must be in (0, 1), got {value}")
        if not self.seeds or not self.learning_rates:
            raise ValueError("seeds and learning_rates must each hold at least one value")

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        """smoke: seconds, for CI; quick: < 5 min on 2 cores; full: several seeds, spread."""
        check_mode(mode)
        if mode == "smoke":
            return cls(mode=mode, learning_rates=(3e-3,), sparsities=(0.8,),
                       lm_sparsities=(0.5, 0.9), vit_d_model=32, vit_d_ff=64, vit_steps=20,
                       vit_batch_size=64, train_examples=2000, validation_examples=200,
                       test_examples=500, lm_seq_len=32, lm_d_model=32, lm_d_ff=64,
                       lm_steps=20, lm_batch_size=16, lm_validation_windows=32)  # fmt: skip
        if mode == "quick":
            return cls(mode=mode)
        # About 1.5 hours on 2 cores: 66 classifier runs and 21 language-model runs.
        return cls(mode=mode, seeds=(0, 1, 2, 3, 4), learning_rates=(1e-3, 2e-3, 4e-3),
                   image_size=28, vit_steps=1500, validation_examples=5000,
                   test_examples=None, lm_d_model=128, lm_d_ff=256, lm_steps=1500,
                   lm_validation_windows=1024)  # fmt: skip


def _settings(config: Config) -> OptimizerSettings:
    return OptimizerSettings(config.weight_decay, config.horst_alpha, config.horst_beta,
                             config.ham_alpha, config.ham_beta)  # fmt: skip


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def _spread(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.stdev(finite) if len(finite) > 1 else math.nan


def _grids(config: Config) -> dict[str, dict[str, list[float]]]:
    return {name: {"lr": list(config.learning_rates)} for name in config.optimizers}


def _vision_recipe(config: Config) -> Recipe:
    shape = {"d_model": config.vit_d_model, "n_layers": config.vit_layers,
             "n_heads": config.vit_heads, "d_ff": config.vit_d_ff}  # fmt: skip
    return Recipe(_settings(config), shape, config.vit_steps, config.vit_batch_size)


def _language_recipe(config: Config) -> Recipe:
    shape = {"d_model": config.lm_d_model, "n_layers": config.lm_layers,
             "n_heads": config.lm_heads, "d_ff": config.lm_d_ff}  # fmt: skip
    return Recipe(_settings(config), shape, config.lm_steps, config.lm_batch_size)


def _classifier_unit(
    cache: UnitCache, splits: Splits, datasets: tuple[Any, Any, Any], recipe: Recipe,
    name: str, lr: float, seed: int, sparsity: float | None,
) -> dict[str, Any]:  # fmt: skip
    """One classifier run through the cache; ``datasets`` = (train, validation, test or None)."""
    unit = {"part": "vit", "optimizer": name, "lr": lr, "seed": seed, "sparsity": sparsity}
    compute = partial(classifier_unit, splits, *datasets, recipe, name, lr, seed, sparsity)
    return cache.run(unit, compute)


def _language_unit(
    cache: UnitCache, splits: Splits, datasets: tuple[Any, Any], recipe: Recipe, name: str,
    lr: float, seed: int, sparsities: tuple[float, ...],
) -> dict[str, Any]:  # fmt: skip
    """One language-model run through the cache; ``datasets`` = (train, validation)."""
    unit = {"part": "lm", "optimizer": name, "lr": lr, "seed": seed}
    compute = partial(language_model_unit, splits, *datasets, recipe, name, lr, seed,
                      sparsities, NEAR_ZERO)  # fmt: skip
    return cache.run(unit, compute)


def tune_classifier(
    config: Config, splits: Splits, train: Any, validation: Any, cache: UnitCache,
    log: Callable[[str], None],
) -> dict[str, Tuning[dict[str, Any]]]:  # fmt: skip
    """Part (a)'s learning-rate sweep: dense runs of the first seed, best validation accuracy.

    ``splits`` only tells the model its input and output sizes; nothing here reads its test
    split (the grid points are dense units, which keep their state for a later test).
    """
    recipe = _vision_recipe(config)

    def run_point(name: str, point: dict[str, Any], data: TuningData) -> dict[str, Any]:
        datasets = (data.train, data.validation, None)
        return _classifier_unit(cache, splits, datasets, recipe, name, point["lr"],
                                config.seeds[0], None)  # fmt: skip

    return tune(_grids(config), run_point, lambda unit: unit["validation_accuracy"],
                TuningData(train, validation), maximize=True, criterion=VISION_CRITERION,
                log=lambda line: log(f"(a) {line}"))  # fmt: skip


def run_classifier(config: Config, log: Callable[[str], None], cache: UnitCache) -> dict[str, Any]:
    """Part (a): the lr sweep (dense), then dense and AC/DC runs for every seed."""
    splits = load_splits("fashion-mnist", seed=0, size=config.image_size, patch=config.patch)
    train = subset(splits.train, config.train_examples)
    validation = subset(splits.validation, config.validation_examples)
    test = subset(splits.test, config.test_examples)
    recipe, first_seed = _vision_recipe(config), config.seeds[0]
    tunings = tune_classifier(config, splits, train, validation, cache, log)
    sweep: dict[str, dict[float, float]] = {}
    chosen: dict[str, float] = {}
    accuracy: dict[str, dict[str, list[float]]] = {}
    achieved: dict[str, dict[str, list[float]]] = {}
    move_ratio: dict[str, dict[str, list[float | None]]] = {}
    dense_weights: dict[str, torch.Tensor] = {}
    for name in config.optimizers:
        tuning = tunings[name]
        sweep[name] = {p["lr"]: s for p, s in zip(tuning.points, tuning.scores, strict=True)}
        lr = chosen[name] = tuning.selected_point["lr"]
        moves: dict[str, list[float | None]] = {"dense": []}
        accuracy[name], achieved[name] = {"dense": []}, {}
        for seed in config.seeds:
            dense = tuning.selected_run if seed == first_seed else _classifier_unit(
                cache, splits, (train, validation, None), recipe, name, lr, seed, None)  # fmt: skip
            # The test split is read here, once per final model, after the selection.
            model = None if dense["state"] is None else restore_classifier(
                splits, recipe.shape, dense["state"])  # fmt: skip
            accuracy[name]["dense"].append(
                evaluate(model, test, "classification")["accuracy"] if model else math.nan
            )
            moves["dense"].append(dense["move_ratio"])
            if seed == first_seed and model is not None:
                dense_weights[name] = prunable_weights(model)
            for target in config.sparsities:
                unit = _classifier_unit(cache, splits, (train, validation, test), recipe, name,
                                        lr, seed, target)  # fmt: skip
                accuracy[name].setdefault(_key(target), []).append(unit["test_accuracy"])
                achieved[name].setdefault(_key(target), []).append(unit["achieved_sparsity"])
                moves.setdefault(_key(target), []).append(unit["move_ratio"])
                log(f"(a) {name} seed {seed} AC/DC {_key(target)}: test accuracy "
                    f"{unit['test_accuracy']:.4f}")  # fmt: skip
        if name == "horst":
            move_ratio[name] = moves
    return {"sweep": sweep, "chosen_lr": chosen, "accuracy": accuracy, "achieved": achieved,
            "move_ratio": move_ratio, "dense_weights": dense_weights, "tunings": tunings,
            "examples": {"train": len(train), "validation": len(validation),
                         "test": len(test)}}  # fmt: skip


def tune_language_model(
    config: Config, splits: Splits, validation: Any, cache: UnitCache,
    log: Callable[[str], None],
) -> dict[str, Tuning[dict[str, Any]]]:  # fmt: skip
    """Part (b)'s learning-rate sweep: dense runs of the first seed, best validation perplexity."""
    recipe = _language_recipe(config)

    def run_point(name: str, point: dict[str, Any], data: TuningData) -> dict[str, Any]:
        return _language_unit(cache, splits, (data.train, data.validation), recipe, name,
                              point["lr"], config.seeds[0], config.lm_sparsities)  # fmt: skip

    return tune(_grids(config), run_point, lambda unit: unit["validation_perplexity"],
                TuningData(splits.train, validation), maximize=False,
                criterion=LANGUAGE_CRITERION, log=lambda line: log(f"(b) {line}"))  # fmt: skip


def run_language_model(
    config: Config, log: Callable[[str], None], cache: UnitCache
) -> dict[str, Any]:
    """Part (b): the lr sweep, dense training per seed, one-shot pruning at each sparsity."""
    splits = load_splits("austen", seq_len=config.lm_seq_len)
    validation = subset(splits.validation, config.lm_validation_windows)
    recipe, first_seed = _language_recipe(config), config.seeds[0]
    tunings = tune_language_model(config, splits, validation, cache, log)
    sweep: dict[str, dict[float, float]] = {}
    chosen: dict[str, float] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    near_zero: dict[str, list[float]] = {}
    move_ratio: dict[str, list[float | None]] = {}
    weights: dict[str, torch.Tensor] = {}
    for name in config.optimizers:
        tuning = tunings[name]
        sweep[name] = {p["lr"]: s for p, s in zip(tuning.points, tuning.scores, strict=True)}
        lr = chosen[name] = tuning.selected_point["lr"]
        curves[name] = {_key(target): [] for target in (0.0, *config.lm_sparsities)}
        near_zero[name], moves = [], []
        for seed in config.seeds:
            unit = tuning.selected_run if seed == first_seed else _language_unit(
                cache, splits, (splits.train, validation), recipe, name, lr, seed,
                config.lm_sparsities)  # fmt: skip
            curves[name]["0%"].append(unit["validation_perplexity"])
            for target in config.lm_sparsities:
                curves[name][_key(target)].append(unit["pruned_perplexity"][_key(target)])
            near_zero[name].append(unit["near_zero_fraction"])
            moves.append(unit["move_ratio"])
            if seed == first_seed and unit["weights"] is not None:
                weights[name] = unit["weights"]
            log(f"(b) {name} seed {seed}: perplexity " + ", ".join(
                f"{k} {v[-1]:.3f}" for k, v in curves[name].items()))  # fmt: skip
        if name == "horst":
            move_ratio[name] = moves
    return {"sweep": sweep, "chosen_lr": chosen, "perplexity": curves,
            "near_zero_fraction": near_zero, "move_ratio": move_ratio, "weights": weights,
            "tunings": tunings, "windows": {"train": len(splits.train),
                                            "validation": len(validation)}}  # fmt: skip


def _tables(config: Config, vision: dict[str, Any], language: dict[str, Any]) -> dict[str, list]:
    full = len(config.seeds) > 1
    rows = []
    for name in config.optimizers:
        row: dict[str, Any] = {"optimizer": name, "lr": vision["chosen_lr"][name]}
        for key, values in vision["accuracy"][name].items():
            row[f"top-1 {key}"] = _mean(values)
            if full:
                row[f"± {key}"] = _spread(values)
        rows.append(row)
    lm_rows = []
    for name in config.optimizers:
        row = {"optimizer": name, "lr": language["chosen_lr"][name]}
        for key, values in language["perplexity"][name].items():
            row[f"ppl {key}"] = _mean(values)
            if full:
                row[f"± {key}"] = _spread(values)
        lm_rows.append(row)
    sweep_rows = [
        {"optimizer": name, "lr": lr, "(a) validation accuracy": vision["sweep"][name][lr],
         "(b) validation perplexity": language["sweep"][name][lr]}
        for name in config.optimizers for lr in config.learning_rates
    ]  # fmt: skip
    return {
        "(a) Fashion-MNIST ViT, AC/DC: top-1 test accuracy (0 % = dense)": rows,
        "(b) Austen character LM, one-shot layer-wise pruning: validation perplexity": lm_rows,
        "Learning-rate sweep (dense, first seed)": sweep_rows,
    }


def _notes(config: Config, vision: dict[str, Any], language: dict[str, Any]) -> list[str]:
    notes = [
        f"(a) Fashion-MNIST resized to {config.image_size}x{config.image_size}, cut into "
        f"{config.patch}x{config.patch} patches ({(config.image_size // config.patch) ** 2} "
        f"tokens of {config.patch**2} pixels); {vision['examples']['train']} training, "
        f"{vision['examples']['validation']} validation and {vision['examples']['test']} test"
        f" images; {config.vit_steps} steps of batch {config.vit_batch_size}.",
        "(a) AC/DC with the paper's ImageNet proportions in steps (10 % dense warm-up, 5 % "
        "phases, 10 % last dense, 15 % final compressed), global magnitude masks over the "
        "attention and feed-forward matrices (the patch projection, positions and head stay "
        "dense), first moments masked at each phase flip.",
        f"(b) Character-level, windows of {config.lm_seq_len}; {config.lm_steps} steps of "
        f"batch {config.lm_batch_size}; perplexity on {language['windows']['validation']} "
        "validation windows; layer-wise (uniform) magnitude pruning of every attention and "
        "feed-forward matrix; the token embedding, positions and the LM head stay dense.",
        "Learning rates: the same sweep for every optimizer on dense training with the first "
        f"seed ({', '.join(f'{lr:g}' for lr in config.learning_rates)}); chosen for (a): "
        + ", ".join(f"{k} {v:g}" for k, v in vision["chosen_lr"].items())
        + "; for (b): "
        + ", ".join(f"{k} {v:g}" for k, v in language["chosen_lr"].items())
        + ". The selected first-seed run is that seed's dense run; the test split is read "
        "once per final model, after the selection.",
        f"Hyperparameters: weight decay {config.weight_decay} on matrices; HORST alpha "
        f"{config.horst_alpha}, beta {config.horst_beta}; HAM alpha {config.ham_alpha}, beta "
        f"{config.ham_beta} around AdamW; warm-up 5 % then cosine decay. Only the learning "
        "rate is swept; HORST's alpha and HAM's alpha and beta stay at the optimizers' "
        "defaults, so a claim that needs a stronger mirror step would not show here.",
        "Manipulation check: HORST's mirror move / Adam move is ||mirror|| / ||theta - "
        "theta_half|| of the step its current moments would take next (convergent.optim."
        "horst_move_ratio), recorded every max(1, steps // 20) steps of every HORST run and "
        "averaged per run; at alpha 1 it is about the typical |w|, so the check asks whether "
        "the mirror step does anything an AdamW step would not.",
    ]
    if config.mode != "full":
        notes.append(f"{config.mode} mode: one seed and short training, so differences of a"
                     " point or two are within noise; the full mode runs 5 seeds.")  # fmt: skip
    return notes


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run the study (resuming from ``out_dir / "units"``) and draw its figures into ``out_dir``."""
    started = time.perf_counter()
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        if progress:
            print(f"[sparsity] {line}", flush=True)

    cache = UnitCache(folder / "units", "sparsity", json_ready(config))
    previous_threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        vision = run_classifier(config, log, cache)
        language = run_language_model(config, log, cache)
    finally:
        torch.set_num_threads(previous_threads)
    log(cache.summary())
    figures = [
        plot_sparsity_curves(config, vision["accuracy"], language["perplexity"],
                             folder / "sparsity_curves.png"),
        plot_histograms(language["weights"], vision["dense_weights"],
                        folder / "weight_histograms.png"),
    ]  # fmt: skip
    data = {
        "vision": {k: v for k, v in vision.items() if k not in ("dense_weights", "tunings")},
        "language": {k: v for k, v in language.items() if k not in ("weights", "tunings")},
        # The first seed's models, as the results before per-seed fractions stored it.
        "near_zero_fraction": {k: v[0] for k, v in language["near_zero_fraction"].items()},
        "near_zero_threshold": NEAR_ZERO,
    }
    tuning = {
        VISION_TUNING: {name: t.to_json() for name, t in vision["tunings"].items()},
        LANGUAGE_TUNING: {name: t.to_json() for name, t in language["tunings"].items()},
    }
    claims = claims_from_results({"config": json_ready(config), "data": json_ready(data)})
    return StudyResult(name="sparsity", mode=config.mode, config=asdict(config),
                       tables=_tables(config, vision, language), claims=claims,
                       figures=[f.name for f in figures], data=data,
                       notes=_notes(config, vision, language),
                       seconds=time.perf_counter() - started, tuning=tuning)  # fmt: skip
