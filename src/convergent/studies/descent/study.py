"""The ``descent`` study's run: every part selected on its grids on validation (the
protocol: :mod:`convergent.studies.descent.config`), then trained from every final seed and
scored once on test; part (c) first pretrains its shared checkpoint (a unit of its own). Every
run is a unit in ``OUT/units`` (resumable); units run in ``workers`` processes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.descent.brief import advice, brief
from convergent.studies.descent.checks import LANGUAGE_TUNING, TEXT_TUNING, VIDEO_TUNING
from convergent.studies.descent.claims import DESIGN, FAMILIES, claims_from_results
from convergent.studies.descent.config import Config
from convergent.studies.descent.language import fine_tunes, pretraining
from convergent.studies.descent.pilot import PILOT_SEEDS, run_pilot
from convergent.studies.descent.report import draw_figures, study_notes, study_tables
from convergent.studies.descent.runs import part_unit
from convergent.studies.descent.selection import denoising_score, language_score, robust_score
from convergent.studies.descent.summary import summary
from convergent.studies.engine import Selection, Unit, run_finals, run_units, select
from convergent.studies.framework import Measured, PilotedStudy, Report, Session, Tuning, UnitCache

# The design of this study's units (`Study.unit_design`).
# 2: a final text unit records which test sentences it classified correctly.
UNIT_DESIGN = 2

# What a language selection unit keeps for the pilot but the report does not show.
SEQUENCE_KEYS = ("validation_sequence_losses", "validation_noisy_sequence_losses")


# The constrained grid trains at the learning rate and weight decay ERM selected, so that the
# two methods differ by the constraints alone.
SHARED_AXES = ("lr_scale", "weight_decay")

Log = Callable[[str], None]
Scorer = Callable[[list[dict[str, Any]], float], Callable[[dict[str, Any]], float]]


def _erm_selected(method: str, tunings: Mapping[str, Tuning[Any]]) -> dict[str, Any]:
    """What the constrained grid takes from ERM's selection (`Selection.inherit`)."""
    if method != "constrained":
        return {}
    return {axis: tunings["erm"].selected_point[axis] for axis in SHARED_AXES}


def _measured(
    config: Config,
    cache: UnitCache,
    grids: Mapping[str, Mapping[str, tuple[Any, ...]]],
    unit: Callable[[str, dict[str, Any], int, bool], Unit],
    scorer: Scorer,
    maximize: bool,
    criterion: str,
    log: Log,
    inherit: bool,
) -> dict[str, Any]:
    """One part: select each method's point on validation (each method's rule reads its own
    grid; with ``inherit``, ERM first and the constrained grid at ERM's selected lr and weight
    decay), then train the selected points from every final seed (``unit(method, point, seed,
    final)``)."""
    selection = Selection(
        grids,
        lambda method, point: unit(method, point, config.selection_seed, False),
        lambda units: scorer(units, config.clean_tolerance),
        maximize,
        criterion,
        per_method=True,
        inherit=_erm_selected if inherit else None,
    )
    selected = select(selection, cache, config.workers, log)
    points = selected.points()
    finals = run_finals(
        cache,
        points,
        config.seeds,
        lambda method, point, seed: unit(method, point, seed, True),
        config.workers,
        log,
    )
    return {
        "selected": points,
        "selection": {
            name: [
                {
                    **point,
                    **selected.inherited[name],
                    **{k: v for k, v in run.items() if k not in SEQUENCE_KEYS},
                }
                for point, run in zip(tuning.points, tuning.runs, strict=True)
            ]
            for name, tuning in selected.tunings.items()
        },
        "runs": finals,
        "tunings": selected.tunings,
    }


def _language(config: Config, cache: UnitCache, log: Log, criterion: str) -> dict[str, Any]:
    """Part (c): pretrain once, run both grids (each method selects its own lr) from that
    checkpoint, select each on validation, then fine-tune the selected points from every
    final seed."""
    (pretrained,) = run_units(cache, [pretraining(config)], 1, log)
    unit = fine_tunes(config, pretrained["state"])
    grids = config.language.grids()
    measured = _measured(
        config, cache, grids, unit, language_score, False, criterion, log, inherit=False
    )
    return {
        "pretraining": {key: value for key, value in pretrained.items() if key != "state"},
        **measured,
        "gammas": list(config.language.gammas),
    }


def _acting_criterion(score: str, tolerance: float, clean: str) -> str:
    """The denoiser's rule in words (part (c)'s too), for the tuning record."""
    return (
        f"{score}, among the method's points where its constraints act (largest lambda >= "
        f"{acting.MULTIPLIER_FLOOR:g}, active in >= {100 * acting.ACTIVE_SHARE_FLOOR:g} % of the "
        f"steps; every point when none does) within {100 * tolerance:g} % of the best such "
        f"{clean} (n/a: outside)"
    )


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
        text = _measured(
            config,
            cache,
            config.grids(),
            functools.partial(part_unit, config, "text"),
            robust_score,
            True,
            f"validation accuracy under Gaussian embedding noise (gamma {config.selection_gamma:g}"
            f"), among the method's points within {100 * config.clean_tolerance:g} point of its "
            "best clean validation accuracy (n/a: outside)",
            lambda line: log(f"(a) {line}"),
            inherit=True,
        )
        video = _measured(
            config,
            cache,
            config.grids(),
            functools.partial(part_unit, config, "video"),
            denoising_score,
            False,
            _acting_criterion(
                f"validation RMSE at {config.selection_multiple:g}x the training noise",
                config.clean_tolerance,
                "RMSE at the training noise",
            ),
            lambda line: log(f"(b) {line}"),
            inherit=True,
        )
        language = (
            _language(
                config,
                cache,
                lambda line: log(f"(c) {line}"),
                _acting_criterion(
                    "validation perplexity under Gaussian embedding noise (gamma "
                    f"{config.language.selection_gamma:g})",
                    config.clean_tolerance,
                    "clean validation perplexity",
                ),
            )
            if config.run_language
            else None
        )
        text["levels"] = config.text_levels()
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
