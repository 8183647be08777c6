"""Part (b) of the ``sparsity`` study: a character-level language model on Jane Austen's
novels, trained densely with each optimizer, then pruned one-shot at each sparsity."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ..data import Splits, load_splits
from .sparsity_claims import LANGUAGE_CRITERION
from .sparsity_claims import sparsity_key as _key
from .sparsity_config import NEAR_ZERO, Config, language_recipe, tuning_grids
from .sparsity_models import subset
from .sparsity_runs import Recipe, language_model_unit
from .tuning import Tuning, TuningData, tune
from .units import UnitCache


def language_unit(
    cache: UnitCache,
    splits: Splits,
    datasets: tuple[Any, Any],
    recipe: Recipe,
    name: str,
    lr: float,
    seed: int,
    sparsities: tuple[float, ...],
) -> dict[str, Any]:
    """One language-model run through the cache; ``datasets`` = (train, validation)."""
    unit = {"part": "lm", "optimizer": name, "lr": lr, "seed": seed}
    compute = partial(
        language_model_unit, splits, *datasets, recipe, name, lr, seed, sparsities, NEAR_ZERO
    )
    return cache.run(unit, compute)


def tune_language_model(
    config: Config,
    splits: Splits,
    validation: Any,
    cache: UnitCache,
    log: Callable[[str], None],
) -> dict[str, Tuning[dict[str, Any]]]:
    """Part (b)'s learning-rate sweep: dense runs of the first seed, best validation perplexity."""
    recipe = language_recipe(config)

    def run_point(name: str, point: dict[str, Any], data: TuningData) -> dict[str, Any]:
        return language_unit(
            cache,
            splits,
            (data.train, data.validation),
            recipe,
            name,
            point["lr"],
            config.seeds[0],
            config.lm_sparsities,
        )

    return tune(
        tuning_grids(config),
        run_point,
        lambda unit: unit["validation_perplexity"],
        TuningData(splits.train, validation),
        maximize=False,
        criterion=LANGUAGE_CRITERION,
        log=lambda line: log(f"(b) {line}"),
    )


def run_language_model(
    config: Config, log: Callable[[str], None], cache: UnitCache
) -> dict[str, Any]:
    """Part (b): the lr sweep, dense training per seed, one-shot pruning at each sparsity."""
    splits = load_splits("austen", seq_len=config.lm_seq_len)
    validation = subset(splits.validation, config.lm_validation_windows)
    recipe, first_seed = language_recipe(config), config.seeds[0]
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
            unit = (
                tuning.selected_run
                if seed == first_seed
                else language_unit(
                    cache,
                    splits,
                    (splits.train, validation),
                    recipe,
                    name,
                    lr,
                    seed,
                    config.lm_sparsities,
                )
            )
            curves[name]["0%"].append(unit["validation_perplexity"])
            for target in config.lm_sparsities:
                curves[name][_key(target)].append(unit["pruned_perplexity"][_key(target)])
            near_zero[name].append(unit["near_zero_fraction"])
            moves.append(unit["move_ratio"])
            if seed == first_seed and unit["weights"] is not None:
                weights[name] = unit["weights"]
            log(
                f"(b) {name} seed {seed}: perplexity "
                + ", ".join(f"{k} {v[-1]:.3f}" for k, v in curves[name].items())
            )
        if name == "horst":
            move_ratio[name] = moves
    return {
        "sweep": sweep,
        "chosen_lr": chosen,
        "perplexity": curves,
        "near_zero_fraction": near_zero,
        "move_ratio": move_ratio,
        "weights": weights,
        "tunings": tunings,
        "windows": {"train": len(splits.train), "validation": len(validation)},
    }
