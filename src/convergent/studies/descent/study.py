"""The ``descent`` study's run: every part, each selected on its grids and then trained from
every final seed.

Each part follows the same protocol (:mod:`convergent.studies.descent.config`): both methods'
declared grids (the same size) are trained with the selection seed and scored on validation;
one rule selects each method's point (the best score under a validation shift among the
points whose clean score is within a tolerance of the method's best clean one; on the
denoiser, among the points where the constraints act, when any does:
:func:`~convergent.studies.descent.selection.denoising_score`); the selected
configurations train from every final seed and are scored once on test. Part (c), the
language model (``run_language``), first pretrains one shared checkpoint (a unit of its own),
and both of its methods select their own learning rate: its grids run side by side, each
selected by :func:`~convergent.studies.descent.selection.language_score`. Every run is a unit in
``OUT/units`` (resumable); units run in ``workers`` processes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.descent.brief import advice, brief
from convergent.studies.descent.claims import DESIGN, FAMILIES, claims_from_results
from convergent.studies.descent.config import METHODS, Config
from convergent.studies.descent.keys import LANGUAGE_TUNING, TEXT_TUNING, VIDEO_TUNING
from convergent.studies.descent.language import (
    LanguageJob,
    PretrainJob,
    language_unit,
    pretrain_unit,
)
from convergent.studies.descent.pilot import PILOT_SEEDS, run_pilot
from convergent.studies.descent.report import draw_figures, study_notes, study_tables
from convergent.studies.descent.runs import Job, text_unit, video_unit
from convergent.studies.descent.selection import denoising_score, language_score, robust_score
from convergent.studies.descent.summary import summary
from convergent.studies.framework import (
    Measured,
    PilotedStudy,
    Report,
    Session,
    Tuning,
    TuningData,
    UnitCache,
    grid_points,
    run_jobs,
    tune,
)

# The design of this study's units (`Study.unit_design`).
# 2: a final text unit records which test sentences it classified correctly.
UNIT_DESIGN = 2

# What a language selection unit keeps for the pilot but the report does not show.
SEQUENCE_KEYS = ("validation_sequence_losses", "validation_noisy_sequence_losses")


# The constrained grid trains at the learning rate and weight decay ERM selected, so that the
# two methods differ by the constraints alone.
SHARED_AXES = ("lr_scale", "weight_decay")


def _select(
    name: str,
    grids: dict[str, dict[str, tuple[Any, ...]]],
    points: dict[str, list[dict[str, Any]]],
    units: dict[tuple[str, int], dict[str, Any]],
    score: Callable[[dict[str, Any]], float],
    maximize: bool,
    criterion: str,
    log: Callable[[str], None],
) -> Tuning[Any]:
    """Method ``name``'s selection on its grid, whose units (``units[(name, index)]``) ran
    already, side by side: `tune` only scores them and selects."""
    (tuning,) = tune(
        {name: grids[name]},
        lambda method, point, _: units[(method, points[method].index(point))],
        score,
        TuningData(None, None),
        maximize=maximize,
        criterion=criterion,
        log=log,
    ).values()
    return tuning


def _final_runs(
    cache: UnitCache,
    finals: list[Any],
    compute: Callable[[Any], dict[str, Any]],
    workers: int,
    log: Callable[[str], None],
) -> dict[str, list[dict[str, Any]]]:
    """Every final job's unit (computed, or read back from the cache), grouped by method in
    seed order."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in METHODS}
    for job, unit in zip(finals, run_jobs(cache, finals, compute, workers, log), strict=True):
        runs[job.method].append(unit)
    return runs


def _part(
    config: Config,
    cache: UnitCache,
    part: str,
    compute: Callable[[Any], dict[str, Any]],
    scorer: Callable[..., Callable[[dict[str, Any]], float]],
    maximize: bool,
    criterion: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Select on the grids (validation; ERM first, the constrained grid at ERM's selected lr
    and weight decay), then train the selected points from every final seed."""
    grids = config.grids()
    points = {name: grid_points(axes) for name, axes in grids.items()}
    units: dict[tuple[str, int], dict[str, Any]] = {}
    tunings: dict[str, Tuning[Any]] = {}
    shared: dict[str, dict[str, Any]] = {}
    for name in METHODS:
        shared[name] = (
            {axis: tunings["erm"].selected_point[axis] for axis in SHARED_AXES}
            if name == "constrained"
            else {}
        )
        jobs = [
            Job(config, part, name, {**point, **shared[name]}, config.selection_seed, final=False)
            for point in points[name]
        ]
        done = run_jobs(cache, jobs, compute, config.workers, log)
        units.update({(name, index): unit for index, unit in enumerate(done)})
        # Each method's clean floor is its own best clean point: what the constraints cost
        # in clean quality is the clean-accuracy claim's to judge, on test.
        score = scorer(done, config.clean_tolerance)
        tunings[name] = _select(name, grids, points, units, score, maximize, criterion, log)
    finals = [
        Job(config, part, name, {**tunings[name].selected_point, **shared[name]}, seed, True)
        for name in METHODS
        for seed in config.seeds
    ]
    runs = _final_runs(cache, finals, compute, config.workers, log)
    return {
        "selected": {
            name: {**tuning.selected_point, **shared[name]} for name, tuning in tunings.items()
        },
        "selection": {
            name: [
                {**point, **shared[name], **units[(name, i)]}
                for i, point in enumerate(points[name])
            ]
            for name in METHODS
        },
        "runs": runs,
        "tunings": tunings,
    }


def _language(
    config: Config, cache: UnitCache, log: Callable[[str], None], criterion: str
) -> dict[str, Any]:
    """Part (c): pretrain once, run both grids (each method selects its own lr) from that
    checkpoint, select each on validation, then fine-tune the selected points from every
    final seed."""
    (pretrained,) = run_jobs(cache, [PretrainJob(config)], pretrain_unit, 1, log)
    start = pretrained["state"]
    grids = config.language.grids()
    points = {name: grid_points(axes) for name, axes in grids.items()}
    jobs = [
        LanguageJob(config, name, point, config.selection_seed, False, start)
        for name in METHODS
        for point in points[name]
    ]
    done = run_jobs(cache, jobs, language_unit, config.workers, log)
    units = {
        (job.method, points[job.method].index(job.point)): unit
        for job, unit in zip(jobs, done, strict=True)
    }
    tunings = {
        name: _select(
            name,
            grids,
            points,
            units,
            language_score(
                [units[(name, index)] for index in range(len(points[name]))],
                config.clean_tolerance,
            ),
            False,
            criterion,
            log,
        )
        for name in METHODS
    }
    finals = [
        LanguageJob(config, name, tunings[name].selected_point, seed, True, start)
        for name in METHODS
        for seed in config.seeds
    ]
    runs = _final_runs(cache, finals, language_unit, config.workers, log)
    return {
        "pretraining": {key: value for key, value in pretrained.items() if key != "state"},
        "selected": {name: tuning.selected_point for name, tuning in tunings.items()},
        "selection": {
            name: [
                {
                    **point,
                    **{k: v for k, v in units[(name, i)].items() if k not in SEQUENCE_KEYS},
                }
                for i, point in enumerate(points[name])
            ]
            for name in METHODS
        },
        "runs": runs,
        "gammas": list(config.language.gammas),
        "tunings": tunings,
    }


class DescentStudy:
    """The ``descent`` study for the framework (:class:`~convergent.studies.framework.Study`)."""

    name = "descent"
    design = DESIGN
    unit_design = UNIT_DESIGN
    config = staticmethod(Config.for_mode)
    families = FAMILIES
    claims_from_results = staticmethod(claims_from_results)
    summary = staticmethod(summary)
    brief = staticmethod(brief)
    advice = staticmethod(advice)
    run_pilot = staticmethod(run_pilot)

    def reserved_seeds(self, config: Config) -> set[int]:
        # The pilots' seeds chose the design (validation only): never final seeds.
        return {config.selection_seed, *PILOT_SEEDS}

    def threads(self, config: Config) -> int:
        return config.threads

    def measure(self, config: Config, session: Session) -> Measured:
        """Every part: selection on its grids, then the final seeds."""
        cache, log = session.cache, session.log
        text = _part(
            config,
            cache,
            "text",
            text_unit,
            robust_score,
            True,
            f"validation accuracy under Gaussian embedding noise (gamma {config.selection_gamma:g}"
            f"), among the method's points within {100 * config.clean_tolerance:g} point of its "
            "best clean validation accuracy (n/a: outside)",
            lambda line: log(f"(a) {line}"),
        )
        video = _part(
            config,
            cache,
            "video",
            video_unit,
            denoising_score,
            False,
            f"validation RMSE at {config.selection_multiple:g}x the training noise, among "
            "the method's points where its constraints act (largest lambda >= "
            f"{acting.MULTIPLIER_FLOOR:g}, active in >= {100 * acting.ACTIVE_SHARE_FLOOR:g} % "
            "of the steps; every point when none does) within "
            f"{100 * config.clean_tolerance:g} % of the best such RMSE at the training noise "
            "(n/a: outside)",
            lambda line: log(f"(b) {line}"),
        )
        language = (
            _language(
                config,
                cache,
                lambda line: log(f"(c) {line}"),
                "validation perplexity under Gaussian embedding noise (gamma "
                f"{config.language.selection_gamma:g}), among the method's points where its "
                f"constraints act (largest lambda >= {acting.MULTIPLIER_FLOOR:g}, active in >= "
                f"{100 * acting.ACTIVE_SHARE_FLOOR:g} % of the steps; every point when none "
                f"does) within {100 * config.clean_tolerance:g} % of the best such clean "
                "validation perplexity (n/a: outside)",
            )
            if config.run_language
            else None
        )
        text["levels"] = {
            "gaussian": config.additive_gammas,
            "uniform": config.additive_gammas,
            "discrete": config.discrete_gammas,
            "typos": config.typo_rates,
            "word_dropout": config.dropout_rates,
        }
        video["sigmas"] = [m * config.train_noise for m in config.noise_multiples]
        parts = {"text": (text, TEXT_TUNING), "video": (video, VIDEO_TUNING)}
        if language is not None:
            parts["language"] = (language, LANGUAGE_TUNING)
        return Measured(
            data={
                part: {k: v for k, v in measured.items() if k != "tunings"}
                for part, (measured, _) in parts.items()
            },
            tuning={
                title: {name: t.to_json() for name, t in measured["tunings"].items()}
                for measured, title in parts.values()
            },
        )

    def report(self, config: Config, measured: Measured, folder: Path) -> Report:
        data = measured.data
        figures = draw_figures(
            data["text"], data["video"], config.noise_multiples, folder, data.get("language")
        )
        return Report(study_tables(config, data), figures, study_notes(config, data))


STUDY: PilotedStudy = DescentStudy()
