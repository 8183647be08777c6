"""The ``sparsity`` study's run: its two parts, each a selection on validation and final runs.

Claims (:mod:`.claims`): at high sparsity HORST keeps more top-1 accuracy than AdamW
and HAM, loses at most half of AdamW's accuracy at 80-90 %, concentrates its weights near zero
(in the ViT and in the LM), and a HORST-trained language model survives one-shot pruning
(magnitude, Wanda, SparseGPT) better than an AdamW-trained one.

(a) A ViT-style classifier (our Transformer on image patches, mean pooling) on Fashion-MNIST,
    trained with AC/DC (global magnitude, straight to the target at each compression).
    Selection: every optimizer's declared grid (the same number of points: HORST alpha x lr,
    HAM alpha x lr, AdamW lr x weight decay) is trained once with the selection seed at the
    selection sparsity (90 %), and the best validation accuracy is selected. Final runs: each
    selected configuration, trained dense and with AC/DC at 70 / 80 / 90 % from each final
    seed (disjoint from the selection seed), scored once on the test split.
(b) A character-level causal Transformer on Jane Austen's novels, trained densely with HORST
    and AdamW, then pruned one-shot layer-wise by magnitude, Wanda and SparseGPT (the last two
    calibrated on a fixed draw of training windows); selection on validation perplexity after
    magnitude pruning to the largest target among the points whose dense validation
    perplexity is within 10 % of the best dense one (either grid), final seeds scored on test
    windows with every pruner.

The manipulation checks are HORST's and HAM's mirror move relative to their AdamW move,
recorded in every HORST and HAM run; alpha's grid runs from a ratio below 0.2 to far above 1.
Every run is a unit in ``OUT/units`` (resumable) and units run in ``workers`` processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from convergent.studies.framework import (
    Measured,
    PilotedStudy,
    Report,
    Session,
    Tuning,
    UnitCache,
    extension_points,
    grid_points,
    run_jobs,
    select_points,
)
from convergent.studies.sparsity.brief import advice, brief
from convergent.studies.sparsity.claims import DESIGN, claims_from_results
from convergent.studies.sparsity.config import (
    LANGUAGE_CRITERION,
    LM_DENSE_TOLERANCE,
    LM_SELECTION_PRUNER,
    RMS_FRACTION,
    VISION_CRITERION,
    Config,
    sparsity_key,
)
from convergent.studies.sparsity.pilot import run_pilot
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
from convergent.studies.sparsity.summary import summary

VISION_TUNING = "(a) ViT, AC/DC at the selection sparsity, selection seed"
LANGUAGE_TUNING = "(b) LM, one-shot at the largest target, selection seed"
MIRRORED = ("horst", "ham")  # the optimizers whose runs record a move ratio


def _select(
    config: Config,
    grids: dict[str, dict[str, tuple[float, ...]]],
    job_of: Callable[[str, dict[str, Any]], Any],
    unit_of: Callable[[Any], dict[str, Any]],
    scorer: Callable[[list[dict[str, Any]]], Callable[[dict[str, Any]], float]],
    maximize: bool,
    criterion: str,
    cache: UnitCache,
    log: Callable[[str], None],
) -> dict[str, Tuning[dict[str, Any]]]:
    """Each optimizer's selection on validation: its declared grid (every grid the same size),
    then up to ``config.extension_rounds`` equal extensions while any selection lies on an edge
    of its grid: every optimizer gets one point beyond the nearer end of each axis
    (`extension_points`), so the budgets stay equal. ``scorer`` makes the score from every
    unit trained so far (the LM's dense floor reads every grid)."""
    points = {name: grid_points(axes) for name, axes in grids.items()}
    units: dict[str, list[dict[str, Any]]] = {name: [] for name in grids}

    def train(new: dict[str, list[dict[str, Any]]]) -> None:
        jobs = [(name, job_of(name, point)) for name, listed in new.items() for point in listed]
        done = run_jobs(cache, [job for _, job in jobs], unit_of, config.workers, log)
        for (name, _), unit in zip(jobs, done, strict=True):
            units[name].append(unit)

    train(points)
    for round_ in range(config.extension_rounds + 1):
        score = scorer([unit for listed in units.values() for unit in listed])
        tunings = {
            name: select_points(
                name, points[name], units[name], score, maximize=maximize, criterion=criterion
            )
            for name in grids
        }
        if round_ == config.extension_rounds or not any(t.on_edge for t in tunings.values()):
            break
        new = {name: extension_points(tuning) for name, tuning in tunings.items()}
        if len({len(listed) for listed in new.values()}) != 1:
            raise ValueError(
                "an extension must give every optimizer the same number of points, got "
                + ", ".join(f"{name} {len(listed)}" for name, listed in new.items())
            )
        log(f"extension round {round_ + 1}: " + "; ".join(f"{n} {v}" for n, v in new.items()))
        for name, listed in new.items():
            points[name] += listed
        train(new)
    for name, tuning in tunings.items():
        edge = f" (on the edge of its grid: {', '.join(tuning.on_edge)})" if tuning.on_edge else ""
        log(f"{name}: selected {tuning.selected_point} of {len(tuning.points)} points{edge}")
    return tunings


def pruned_score_of_good_dense(
    units: list[dict[str, Any]], key: str, tolerance: float = LM_DENSE_TOLERANCE
) -> Callable[[dict[str, Any]], float]:
    """The language models' selection score: validation perplexity after magnitude pruning to
    ``key``, NaN (never selected) for a unit whose dense perplexity exceeds ``tolerance`` x the
    best dense one among ``units`` (every optimizer's grid). Without the bound a strong mirror
    step wins on pruned perplexity with a dense model no one would keep (a HORST LM at twice
    AdamW's dense perplexity)."""
    scores = [u["perplexity"][LM_SELECTION_PRUNER] for u in units]
    dense = [s["0%"] for s in scores if math.isfinite(s["0%"])]
    bound = tolerance * min(dense) if dense else math.nan

    def score(unit: dict[str, Any]) -> float:
        scored = unit["perplexity"][LM_SELECTION_PRUNER]
        return scored[key] if scored["0%"] <= bound else math.nan

    return score


def _selections(
    tunings: dict[str, Tuning[dict[str, Any]]], shown: str, scored: str
) -> dict[str, Any]:
    """Each optimizer's selected point and its grid as ``results.json`` keeps them: every point
    with its unit's ``scored`` validation number (as ``shown``), move ratio and strength."""
    return {
        "selected": {name: tuning.selected_point for name, tuning in tunings.items()},
        "selection": {
            name: [
                {
                    **point,
                    shown: unit[scored],
                    "move_ratio": unit["move_ratio"],
                    "strength": unit["strength"],
                }
                for point, unit in zip(tuning.points, tuning.runs, strict=True)
            ]
            for name, tuning in tunings.items()
        },
    }


def _vision_part(config: Config, cache: UnitCache, log: Callable[[str], None]) -> dict[str, Any]:
    tunings = _select(
        config,
        config.grids(),
        lambda name, point: VisionJob(
            config, name, point, config.selection_seed, config.selection_sparsity, final=False
        ),
        vision_unit,
        lambda _: lambda unit: unit["validation_accuracy"],
        True,
        VISION_CRITERION,
        cache,
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
    mirrored = [name for name in MIRRORED if name in config.optimizers]
    moves: dict[str, dict[str, list[Any]]] = {n: {k: [] for k in keys} for n in mirrored}
    strength: dict[str, list[Any]] = {"horst": []} if "horst" in config.optimizers else {}
    share: dict[str, list[float]] = {n: [] for n in config.optimizers}
    histograms: dict[str, torch.Tensor] = {}
    for job, unit in zip(finals, results, strict=True):
        key = "dense" if job.sparsity is None else sparsity_key(job.sparsity)
        accuracy[job.optimizer][key].append(unit["test_accuracy"])
        if job.sparsity is None:
            share[job.optimizer].append(unit["near_zero_share"])
            if job.optimizer in strength:
                strength[job.optimizer].append(unit["strength"])
            if job.seed == config.seeds[0] and unit["histogram"] is not None:
                histograms[job.optimizer] = unit["histogram"]
        else:
            achieved[job.optimizer][key].append(unit["achieved_sparsity"])
        if job.optimizer in moves:
            moves[job.optimizer][key].append(unit["move_ratio"])
    return {
        **_selections(tunings, "validation_accuracy", "validation_accuracy"),
        "accuracy": accuracy,
        "achieved": achieved,
        "move_ratio": moves,
        "strength": strength,
        "near_zero_share": share,
        "histograms": histograms,
        "tunings": tunings,
    }


def _language_part(config: Config, cache: UnitCache, log: Callable[[str], None]) -> dict[str, Any]:
    grids = config.language_grids()
    top = sparsity_key(max(config.lm_sparsities))
    tunings = _select(
        config,
        grids,
        lambda name, point: LanguageJob(config, name, point, config.selection_seed, final=False),
        language_unit,
        lambda units: pruned_score_of_good_dense(units, top),
        False,
        LANGUAGE_CRITERION,
        cache,
        lambda line: log(f"(b) {line}"),
    )
    finals = [
        LanguageJob(config, name, tunings[name].selected_point, seed, final=True)
        for name in config.lm_optimizers
        for seed in config.seeds
    ]
    results = run_jobs(cache, finals, language_unit, config.workers, log)
    keys = ["0%", *(sparsity_key(t) for t in config.lm_sparsities)]
    perplexity: dict[str, dict[str, dict[str, list[float]]]] = {
        n: {p: {k: [] for k in keys} for p in config.lm_pruners} for n in grids
    }
    share: dict[str, list[float]] = {n: [] for n in grids}
    moves: dict[str, list[Any]] = {"horst": []} if "horst" in grids else {}
    strength: dict[str, list[Any]] = {"horst": []} if "horst" in grids else {}
    histograms: dict[str, torch.Tensor] = {}
    for job, unit in zip(finals, results, strict=True):
        for pruner in config.lm_pruners:
            for key in keys:
                perplexity[job.optimizer][pruner][key].append(unit["perplexity"][pruner][key])
        share[job.optimizer].append(unit["near_zero_share"])
        if job.optimizer in moves:
            moves[job.optimizer].append(unit["move_ratio"])
            strength[job.optimizer].append(unit["strength"])
        if job.seed == config.seeds[0] and unit["histogram"] is not None:
            histograms[job.optimizer] = unit["histogram"]
    return {
        **_selections(tunings, "validation_perplexity", "perplexity"),
        "perplexity": perplexity,
        "move_ratio": moves,
        "strength": strength,
        "near_zero_share": share,
        "histograms": histograms,
        "tunings": tunings,
    }


class SparsityStudy:
    """The ``sparsity`` study for the framework (:class:`~convergent.studies.framework.Study`)."""

    name = "sparsity"
    design = DESIGN
    unit_design = UNIT_DESIGN
    config = staticmethod(Config.for_mode)
    claims_from_results = staticmethod(claims_from_results)
    summary = staticmethod(summary)
    brief = staticmethod(brief)
    advice = staticmethod(advice)
    run_pilot = staticmethod(run_pilot)

    def reserved_seeds(self, config: Config) -> set[int]:
        return {config.selection_seed}

    def threads(self, config: Config) -> int:
        return config.threads

    def measure(self, config: Config, session: Session) -> Measured:
        """Both parts, each a selection on validation and final runs."""
        vision = _vision_part(config, session.cache, session.log)
        language = _language_part(config, session.cache, session.log)
        hidden = ("histograms", "tunings")
        return Measured(
            data={
                "vision": {k: v for k, v in vision.items() if k not in hidden},
                "language": {k: v for k, v in language.items() if k not in hidden},
                "rms_fraction": RMS_FRACTION,
            },
            tuning={
                VISION_TUNING: {name: t.to_json() for name, t in vision["tunings"].items()},
                LANGUAGE_TUNING: {name: t.to_json() for name, t in language["tunings"].items()},
            },
            unsaved={
                "histograms": {"vision": vision["histograms"], "language": language["histograms"]}
            },
        )

    def report(self, config: Config, measured: Measured, folder: Path) -> Report:
        data, histograms = measured.data, measured.unsaved["histograms"]
        figures = [
            plot_sparsity_curves(
                config,
                data["vision"]["accuracy"],
                data["language"]["perplexity"],
                folder / "sparsity_curves.png",
            ),
            plot_alpha_sweep(data["vision"]["selection"], folder / "alpha_sweep.png"),
            plot_histograms(
                histograms["vision"], histograms["language"], folder / "weight_histograms.png"
            ),
        ]
        return Report(
            study_tables(config, data),
            [f.name for f in figures],
            study_notes(config, data, measured.tuning),
        )


STUDY: PilotedStudy = SparsityStudy()
