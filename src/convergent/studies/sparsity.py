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
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..data import Splits, load_splits
from ..train import evaluate
from .common import StudyResult, json_ready
from .sparsity_claims import (
    LANGUAGE_TUNING,
    VISION_CRITERION,
    VISION_TUNING,
    claims_from_results,
    tuning_from_results,
)
from .sparsity_claims import sparsity_key as _key
from .sparsity_config import NEAR_ZERO, Config, tuning_grids, vision_recipe
from .sparsity_language import run_language_model
from .sparsity_models import subset
from .sparsity_plots import plot_histograms, plot_sparsity_curves
from .sparsity_report import study_notes, study_tables
from .sparsity_runs import Recipe, classifier_unit, prunable_weights, restore_classifier
from .tuning import Tuning, TuningData, tune
from .units import UnitCache

__all__ = ["NEAR_ZERO", "Config", "claims_from_results", "run", "tuning_from_results"]


def _classifier_unit(
    cache: UnitCache,
    splits: Splits,
    datasets: tuple[Any, Any, Any],
    recipe: Recipe,
    name: str,
    lr: float,
    seed: int,
    sparsity: float | None,
) -> dict[str, Any]:
    """One classifier run through the cache; ``datasets`` = (train, validation, test or None)."""
    unit = {"part": "vit", "optimizer": name, "lr": lr, "seed": seed, "sparsity": sparsity}
    compute = partial(classifier_unit, splits, *datasets, recipe, name, lr, seed, sparsity)
    return cache.run(unit, compute)


def tune_classifier(
    config: Config,
    splits: Splits,
    train: Any,
    validation: Any,
    cache: UnitCache,
    log: Callable[[str], None],
) -> dict[str, Tuning[dict[str, Any]]]:
    """Part (a)'s learning-rate sweep: dense runs of the first seed, best validation accuracy.

    ``splits`` only tells the model its input and output sizes; nothing here reads its test
    split (the grid points are dense units, which keep their state for a later test).
    """
    recipe = vision_recipe(config)

    def run_point(name: str, point: dict[str, Any], data: TuningData) -> dict[str, Any]:
        datasets = (data.train, data.validation, None)
        return _classifier_unit(
            cache, splits, datasets, recipe, name, point["lr"], config.seeds[0], None
        )

    return tune(
        tuning_grids(config),
        run_point,
        lambda unit: unit["validation_accuracy"],
        TuningData(train, validation),
        maximize=True,
        criterion=VISION_CRITERION,
        log=lambda line: log(f"(a) {line}"),
    )


def run_classifier(config: Config, log: Callable[[str], None], cache: UnitCache) -> dict[str, Any]:
    """Part (a): the lr sweep (dense), then dense and AC/DC runs for every seed."""
    splits = load_splits("fashion-mnist", seed=0, size=config.image_size, patch=config.patch)
    train = subset(splits.train, config.train_examples)
    validation = subset(splits.validation, config.validation_examples)
    test = subset(splits.test, config.test_examples)
    recipe, first_seed = vision_recipe(config), config.seeds[0]
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
            dense = (
                tuning.selected_run
                if seed == first_seed
                else _classifier_unit(
                    cache, splits, (train, validation, None), recipe, name, lr, seed, None
                )
            )
            # The test split is read here, once per final model, after the selection.
            model = (
                None
                if dense["state"] is None
                else restore_classifier(splits, recipe.shape, dense["state"])
            )
            accuracy[name]["dense"].append(
                evaluate(model, test, "classification")["accuracy"] if model else math.nan
            )
            moves["dense"].append(dense["move_ratio"])
            if seed == first_seed and model is not None:
                dense_weights[name] = prunable_weights(model)
            for target in config.sparsities:
                unit = _classifier_unit(
                    cache, splits, (train, validation, test), recipe, name, lr, seed, target
                )
                accuracy[name].setdefault(_key(target), []).append(unit["test_accuracy"])
                achieved[name].setdefault(_key(target), []).append(unit["achieved_sparsity"])
                moves.setdefault(_key(target), []).append(unit["move_ratio"])
                log(
                    f"(a) {name} seed {seed} AC/DC {_key(target)}: test accuracy "
                    f"{unit['test_accuracy']:.4f}"
                )
        if name == "horst":
            move_ratio[name] = moves
    return {
        "sweep": sweep,
        "chosen_lr": chosen,
        "accuracy": accuracy,
        "achieved": achieved,
        "move_ratio": move_ratio,
        "dense_weights": dense_weights,
        "tunings": tunings,
        "examples": {"train": len(train), "validation": len(validation), "test": len(test)},
    }


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
        plot_sparsity_curves(
            config, vision["accuracy"], language["perplexity"], folder / "sparsity_curves.png"
        ),
        plot_histograms(
            language["weights"], vision["dense_weights"], folder / "weight_histograms.png"
        ),
    ]
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
    return StudyResult(
        name="sparsity",
        mode=config.mode,
        config=asdict(config),
        tables=study_tables(config, vision, language),
        claims=claims,
        figures=[f.name for f in figures],
        data=data,
        notes=study_notes(config, vision, language),
        seconds=time.perf_counter() - started,
        tuning=tuning,
    )
