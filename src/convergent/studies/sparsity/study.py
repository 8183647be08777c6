"""The ``sparsity`` study's run: its two parts, each a selection on validation and final runs.

Claims (:mod:`.claims`): at high sparsity HORST keeps more top-1 accuracy than AdamW
and HAM, loses at most half of AdamW's accuracy at 80-90 %, concentrates its weights near zero,
and a HORST-trained language model survives one-shot pruning better than an AdamW-trained one.

(a) A ViT-style classifier (our Transformer on image patches, mean pooling) on Fashion-MNIST,
    trained with AC/DC (global magnitude, straight to the target at each compression).
    Selection: every optimizer's declared grid (the same number of points: HORST alpha x lr,
    HAM alpha x lr, AdamW lr x weight decay) is trained once with the selection seed at the
    selection sparsity (90 %), and the best validation accuracy is selected. Final runs: each
    selected configuration, trained dense and with AC/DC at 70 / 80 / 90 % from each final
    seed (disjoint from the selection seed), scored once on the test split.
(b) A character-level causal Transformer on Jane Austen's novels, trained densely with HORST
    and AdamW, then pruned one-shot layer-wise by magnitude; selection on validation perplexity
    at the largest target among the points whose dense validation perplexity is within 10 % of
    the best dense one (either grid), final seeds scored on test windows.

The manipulation check is HORST's mirror move relative to its AdamW move, recorded in every
HORST run; alpha's grid runs from a ratio below 0.2 to far above 1. Every run is a unit in
``OUT/units`` (resumable) and units run in ``workers`` processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from convergent.studies.framework import (
    StudyResult,
    Tuning,
    TuningData,
    UnitCache,
    finish,
    grid_points,
    json_ready,
    run_jobs,
    tune,
    unit_session,
)
from convergent.studies.sparsity.claims import DESIGN, claims_from_results
from convergent.studies.sparsity.config import (
    LANGUAGE_CRITERION,
    LM_DENSE_TOLERANCE,
    RMS_FRACTION,
    VISION_CRITERION,
    Config,
    sparsity_key,
)
from convergent.studies.sparsity.report import (
    plot_alpha_sweep,
    plot_histograms,
    plot_sparsity_curves,
    study_notes,
    study_tables,
)
from convergent.studies.sparsity.runs import (
    UNIT_DESIGN,
    LanguageJob,
    VisionJob,
    language_unit,
    vision_unit,
)

VISION_TUNING = "(a) ViT, AC/DC at the selection sparsity, selection seed"
LANGUAGE_TUNING = "(b) LM, one-shot at the largest target, selection seed"


def _select(
    grids: dict[str, dict[str, tuple[float, ...]]],
    units: dict[tuple[str, int], dict[str, Any]],
    score: Callable[[dict[str, Any]], float],
    maximize: bool,
    criterion: str,
    log: Callable[[str], None],
) -> dict[str, Tuning[dict[str, Any]]]:
    """Each optimizer's selection from the finished grid units (equal grids, validation only)."""
    points = {name: grid_points(axes) for name, axes in grids.items()}

    def run_point(name: str, point: dict[str, Any], _: TuningData) -> dict[str, Any]:
        return units[(name, points[name].index(point))]

    # The grid units ran already (in parallel); tune() only scores and selects them. Its
    # TuningData is empty: nothing here can reach a split, let alone the test split.
    return tune(
        grids,
        run_point,
        score,
        TuningData(None, None),
        maximize=maximize,
        criterion=criterion,
        log=log,
    )


def pruned_score_of_good_dense(
    units: list[dict[str, Any]], key: str, tolerance: float = LM_DENSE_TOLERANCE
) -> Callable[[dict[str, Any]], float]:
    """The language models' selection score: validation perplexity after pruning to ``key``,
    NaN (never selected) for a unit whose dense perplexity exceeds ``tolerance`` x the best
    dense one among ``units`` (every optimizer's grid). Without the bound a strong mirror step
    wins on pruned perplexity with a dense model no one would keep (a HORST LM at twice
    AdamW's dense perplexity)."""
    dense = [u["perplexity"]["0%"] for u in units if math.isfinite(u["perplexity"]["0%"])]
    bound = tolerance * min(dense) if dense else math.nan

    def score(unit: dict[str, Any]) -> float:
        return unit["perplexity"][key] if unit["perplexity"]["0%"] <= bound else math.nan

    return score


def _vision_part(config: Config, cache: UnitCache, log: Callable[[str], None]) -> dict[str, Any]:
    grids = config.grids()
    selection = [
        (
            name,
            index,
            VisionJob(
                config, name, point, config.selection_seed, config.selection_sparsity, final=False
            ),
        )
        for name, axes in grids.items()
        for index, point in enumerate(grid_points(axes))
    ]
    done = run_jobs(cache, [job for *_, job in selection], vision_unit, config.workers, log)
    units = {(name, index): unit for (name, index, _), unit in zip(selection, done, strict=True)}
    tunings = _select(
        grids,
        units,
        lambda u: u["validation_accuracy"],
        True,
        VISION_CRITERION,
        lambda line: log(f"(a) {line}"),
    )
    targets: list[float | None] = [None, *config.sparsities]
    finals = [
        VisionJob(config, name, tunings[name].selected_point, seed, target, final=True)
        for name in config.optimizers
        for seed in config.seeds
        for target in targets
    ]
    results = run_jobs(cache, finals, vision_unit, config.workers, log)
    keys = ["dense" if t is None else sparsity_key(t) for t in targets]
    accuracy: dict[str, dict[str, list[float]]] = {
        n: {k: [] for k in keys} for n in config.optimizers
    }
    achieved: dict[str, dict[str, list[float]]] = {
        n: {k: [] for k in keys[1:]} for n in config.optimizers
    }
    moves: dict[str, list[Any]] = {k: [] for k in keys}
    share: dict[str, list[float]] = {n: [] for n in config.optimizers}
    histograms: dict[str, torch.Tensor] = {}
    for job, unit in zip(finals, results, strict=True):
        key = "dense" if job.sparsity is None else sparsity_key(job.sparsity)
        accuracy[job.optimizer][key].append(unit["test_accuracy"])
        if job.sparsity is None:
            share[job.optimizer].append(unit["near_zero_share"])
            if job.seed == config.seeds[0] and unit["histogram"] is not None:
                histograms[job.optimizer] = unit["histogram"]
        else:
            achieved[job.optimizer][key].append(unit["achieved_sparsity"])
        if job.optimizer == "horst":
            moves[key].append(unit["move_ratio"])
    return {
        "selected": {name: tuning.selected_point for name, tuning in tunings.items()},
        "selection": {
            name: [
                {
                    **point,
                    "validation_accuracy": units[(name, i)]["validation_accuracy"],
                    "move_ratio": units[(name, i)]["move_ratio"],
                }
                for i, point in enumerate(grid_points(grids[name]))
            ]
            for name in grids
        },
        "accuracy": accuracy,
        "achieved": achieved,
        "move_ratio": {"horst": moves} if "horst" in config.optimizers else {},
        "near_zero_share": share,
        "histograms": histograms,
        "tunings": tunings,
    }


def _language_part(config: Config, cache: UnitCache, log: Callable[[str], None]) -> dict[str, Any]:
    grids = config.language_grids()
    selection = [
        (name, index, LanguageJob(config, name, point, config.selection_seed, final=False))
        for name, axes in grids.items()
        for index, point in enumerate(grid_points(axes))
    ]
    done = run_jobs(cache, [job for *_, job in selection], language_unit, config.workers, log)
    units = {(name, index): unit for (name, index, _), unit in zip(selection, done, strict=True)}
    top = sparsity_key(max(config.lm_sparsities))
    tunings = _select(
        grids,
        units,
        pruned_score_of_good_dense(list(units.values()), top),
        False,
        LANGUAGE_CRITERION,
        lambda line: log(f"(b) {line}"),
    )
    finals = [
        LanguageJob(config, name, tunings[name].selected_point, seed, final=True)
        for name in config.lm_optimizers
        for seed in config.seeds
    ]
    results = run_jobs(cache, finals, language_unit, config.workers, log)
    keys = ["0%", *(sparsity_key(t) for t in config.lm_sparsities)]
    perplexity: dict[str, dict[str, list[float]]] = {n: {k: [] for k in keys} for n in grids}
    share: dict[str, list[float]] = {n: [] for n in grids}
    moves: list[Any] = []
    histograms: dict[str, torch.Tensor] = {}
    for job, unit in zip(finals, results, strict=True):
        for key in keys:
            perplexity[job.optimizer][key].append(unit["perplexity"][key])
        share[job.optimizer].append(unit["near_zero_share"])
        if job.optimizer == "horst":
            moves.append(unit["move_ratio"])
        if job.seed == config.seeds[0] and unit["histogram"] is not None:
            histograms[job.optimizer] = unit["histogram"]
    return {
        "selected": {name: tuning.selected_point for name, tuning in tunings.items()},
        "selection": {
            name: [
                {
                    **point,
                    "validation_perplexity": units[(name, i)]["perplexity"],
                    "move_ratio": units[(name, i)]["move_ratio"],
                }
                for i, point in enumerate(grid_points(grids[name]))
            ]
            for name in grids
        },
        "perplexity": perplexity,
        "move_ratio": {"horst": moves} if "horst" in grids else {},
        "near_zero_share": share,
        "histograms": histograms,
        "tunings": tunings,
    }


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run the study (resuming from ``out_dir / "units"``) and draw its figures into ``out_dir``."""
    started = time.perf_counter()
    with unit_session(
        "sparsity", config, out_dir, config.threads, progress, design=UNIT_DESIGN
    ) as session:
        folder, log, cache = session
        vision = _vision_part(config, cache, log)
        language = _language_part(config, cache, log)
    log(cache.summary())
    figures = [
        plot_sparsity_curves(
            config, vision["accuracy"], language["perplexity"], folder / "sparsity_curves.png"
        ),
        plot_alpha_sweep(vision["selection"], folder / "alpha_sweep.png"),
        plot_histograms(
            vision["histograms"], language["histograms"], folder / "weight_histograms.png"
        ),
    ]
    hidden = ("histograms", "tunings")
    data = {
        "design": DESIGN,
        "vision": {k: v for k, v in vision.items() if k not in hidden},
        "language": {k: v for k, v in language.items() if k not in hidden},
        "rms_fraction": RMS_FRACTION,
    }
    tuning = {
        VISION_TUNING: {name: t.to_json() for name, t in vision["tunings"].items()},
        LANGUAGE_TUNING: {name: t.to_json() for name, t in language["tunings"].items()},
    }
    claims = claims_from_results({"config": json_ready(config), "data": json_ready(data)})
    return finish(
        "sparsity",
        config,
        started,
        cache.summary(),
        claims=claims,
        data=data,
        tables=study_tables(config, data),
        figures=[f.name for f in figures],
        notes=study_notes(config, data, tuning),
        tuning=tuning,
    )
