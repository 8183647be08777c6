"""The ``descent`` study's regime pilot: the denoiser depth at which ERM's per-layer losses
have bumps, on the validation frames alone.

The claim that the constraints make per-layer losses fall monotonically where ERM's do not
needs an ERM whose losses rise somewhere (the claim's room check: a rise above 1 % in at least
half the ERM seeds). The pilot reads ERM only, and the validation frames only: no constrained
number, and no test frame, can steer the choice. It supersedes design 2's ERM-only pilot
(docs/results/descent-full/erm_bump_pilot.json), which scored the crops of the frames the test
split uses.

For each depth of :data:`PILOT_DEPTHS`, in the declared order (design 2's 8 layers first):

1. ERM trains at every point of its declared grid (the full mode's lr x weight decay, for the
   full mode's steps) from the first pilot seed, and the study's own video rule selects its
   point on validation (:func:`~convergent.studies.descent.selection.denoising_score`).
2. The selected point trains from the other pilot seeds; each of the three runs' per-layer
   validation MSE at the training noise gives its largest relative rise max_l f_l / f_(l-1) - 1.
3. The first depth where the rise exceeds the claims' 1 % in at least :data:`PILOT_BUMP_SHARE`
   of the pilot seeds (two of three: above the claim's half, a margin for seed noise) is chosen,
   and the pilot stops. If none is, the pilot says so and the depth with the largest share is
   used (ties: the earlier one); the claims' own room check on test then decides.

The rule, declared before the pilot runs: design 3 keeps the 8-layer denoiser if the pilot
chooses it; otherwise the full mode's ``denoiser_layers`` becomes the pilot's ``used`` depth
before the study runs. Cost: 8 runs of 1000 denoiser steps per depth, about 10-20 CPU-minutes
at 8 layers and 1.5 times that at 12 (`run_depth_pilot`).
``convergent reproduce descent --pilot --out OUT`` runs it and then part (c)'s pilot
(`run_pilot`), writing ``OUT/descent-pilot/pilot.json``.

Part (c) has a pilot of its own (:func:`run_language_pilot`, ERM only, validation windows
only, seeds 30-32), which reports and changes nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scipy import stats

from convergent.io import write_text_atomically
from convergent.studies.descent.checks import MONOTONE_TOLERANCE, largest_relative_increase
from convergent.studies.descent.config import Config
from convergent.studies.descent.language import fine_tunes, pretraining, validation_data
from convergent.studies.descent.language_claims import WIN_CLEAN_MARGIN, WIN_NOISE_MARGIN
from convergent.studies.descent.measures import sequence_wins
from convergent.studies.descent.runs import video_unit
from convergent.studies.descent.selection import denoising_score, language_score
from convergent.studies.engine import (
    Rule,
    Selection,
    Unit,
    run_finals,
    run_units,
    select,
    training_key,
)
from convergent.studies.framework import Tuning, UnitCache, json_ready

PILOT_DEPTHS = (8, 12)
PILOT_SEEDS = (30, 31, 32)  # no earlier design read seeds 20 and up; the study runs 20-25
PILOT_BUMP_SHARE = 2 / 3  # above the claims' BUMP_SHARE_FLOOR (1/2)
# The pilot's own unit design: raise it when its units would compute other numbers.
PILOT_UNIT_DESIGN = 1


def pilot_config(layers: int, base: Config | None = None, workers: int = 2) -> Config:
    """``base`` (the full mode's config by default) with ``layers`` denoiser layers, the
    first pilot seed as its selection seed and the others as its seeds."""
    return dataclasses.replace(_at_pilot_seeds(base, workers), denoiser_layers=layers)


def _at_pilot_seeds(base: Config | None, workers: int) -> Config:
    """``base`` (the full mode's config by default) selecting and training on the pilot seeds."""
    return dataclasses.replace(
        base or Config.for_mode("full"),
        selection_seed=PILOT_SEEDS[0],
        seeds=PILOT_SEEDS[1:],
        workers=workers,
    )


def timed_video_unit(
    config: Config, method: str, point: dict[str, Any], seed: int, final: bool
) -> dict[str, Any]:
    """`video_unit` and its wall time in seconds."""
    start = time.perf_counter()
    unit = video_unit(config, method, point, seed, final)
    return {**unit, "seconds": time.perf_counter() - start}


def _selected_at_pilot_seeds(
    cache: UnitCache,
    axes: Mapping[str, Sequence[Any]],
    unit: Callable[[dict[str, Any], int], Unit],
    rule: Rule,
    workers: int,
    log: Callable[[str], None],
) -> tuple[Tuning[dict[str, Any]], list[dict[str, Any]], list[float]]:
    """ERM's grid search on the first pilot seed (``unit(point, seed)``; the first point is
    selected when every point diverged: the record shows it), the selected point's runs from
    every pilot seed (the grid's own unit first) and each run's largest layer-to-layer rise."""
    selection = Selection(
        {"erm": axes},
        lambda _, point: unit(point, PILOT_SEEDS[0]),
        rule,
        maximize=False,
        criterion="the study's rule",
        per_method=True,
    )
    tuning = select(selection, cache, workers, log).tunings["erm"]
    (others,) = run_finals(
        cache,
        {"erm": tuning.selected_point},
        PILOT_SEEDS[1:],
        lambda _, point, seed: unit(point, seed),
        workers,
        log,
    ).values()
    runs = [tuning.selected_run, *others]
    rises = [
        largest_relative_increase(run["layer_losses"]) if "layer_losses" in run else math.nan
        for run in runs
    ]
    return tuning, runs, rises


def _selection_record(
    tuning: Tuning[dict[str, Any]],
    measured: Sequence[str],
    runs: Sequence[Mapping[str, Any]],
    rises: Sequence[float],
) -> dict[str, Any]:
    """What a pilot records of `_selected_at_pilot_seeds`: each grid point with its unit's
    ``measured`` values, the selected point, its runs' per-layer losses and largest rises, and
    the share of those rises that are bumps."""
    return {
        "grid": [
            {**point, **{key: unit[key] for key in measured}}
            for point, unit in zip(tuning.points, tuning.runs, strict=True)
        ],
        "selected": dict(tuning.selected_point),
        "seeds": list(PILOT_SEEDS),
        "layer_losses": [run.get("layer_losses") for run in runs],
        "largest_rise": list(rises),
        "bump_share": sum(rise > MONOTONE_TOLERANCE for rise in rises) / len(rises),
    }


def _depth(config: Config, out_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """One candidate depth: ERM's grid, its selected point from every pilot seed, the rises."""
    cache = UnitCache(
        out_dir / "units", "descent-pilot", json_ready(config), design=PILOT_UNIT_DESIGN
    )

    def unit(point: dict[str, Any], seed: int) -> Unit:
        key = training_key("video", point, seed, False, method="erm")
        return Unit(key, timed_video_unit, (config, "erm", point, seed, False), config.threads)

    tuning, runs, rises = _selected_at_pilot_seeds(
        cache, config.grids()["erm"], unit, lambda u: denoising_score(u, config.clean_tolerance),
        config.workers, log,
    )  # fmt: skip
    seconds = [unit["seconds"] for unit in [*tuning.runs, *runs[1:]]]
    log(f"pilot {config.denoiser_layers} layers: {tuning.selected_point}, rises {rises}")
    measured = ("validation_rmse_train_noise", "validation_rmse_selection", "seconds")
    return {
        "layers": config.denoiser_layers,
        **_selection_record(tuning, measured, runs, rises),
        "seconds_per_run": sum(seconds) / len(seconds),
    }


def run_depth_pilot(
    out_dir: str | Path,
    workers: int = 2,
    log: Callable[[str], None] = print,
    base: Config | None = None,
) -> dict[str, Any]:
    """Run (or resume, from ``out_dir/units``) the pilot.

    Args:
        out_dir: where its units go.
        workers: processes running units side by side.
        log: called with progress lines.
        base: the config whose grid, steps and data the pilot uses (the full mode's by
            default; tests pass a smaller one).

    Returns:
        ``{"depths": [one record per depth tried], "chosen": the first depth meeting the rule
        or None, "used": the depth the study is to use, "rule", "seeds", "threshold"}``.
    """
    rows = []
    chosen = None
    for layers in PILOT_DEPTHS:
        row = _depth(pilot_config(layers, base, workers), Path(out_dir), log)
        rows.append(row)
        if row["bump_share"] >= PILOT_BUMP_SHARE:
            chosen = layers
            break
    if chosen is None:
        used = max(rows, key=lambda row: row["bump_share"])["layers"]  # ties: the first
        log(f"pilot: no depth met the rule; the largest bump share is {used} layers'")
    else:
        used = chosen
    return {
        "depths": rows,
        "chosen": chosen,
        "used": used,
        "rule": (
            f"the first of {list(PILOT_DEPTHS)} layers where ERM's per-layer validation MSE, at "
            f"its point selected on validation, rises more than {100 * MONOTONE_TOLERANCE:g} % "
            f"from one layer to the next in at least {PILOT_BUMP_SHARE:.2g} of the seeds "
            f"{list(PILOT_SEEDS)}; design 3 keeps 8 layers if chosen, else uses 'used'"
        ),
        "seeds": list(PILOT_SEEDS),
        "threshold": PILOT_BUMP_SHARE,
    }


# Part (c)'s pilot: the language model's regime and the win rate's resolution, ERM only.
LANGUAGE_PILOT_UNIT_DESIGN = 1


def expected_half_width(spread: float, seeds: int, windows: int) -> float:
    """The expected half-width of a win rate's interval over ``windows`` test windows and
    ``seeds`` seeds: t_(0.975, seeds - 1) x sqrt(spread^2 / seeds + 0.25 / (windows x seeds)),
    a seed-to-seed SD ``spread`` of the per-seed win rate plus the binomial spread of
    independent windows at 50 % (conservative: the t quantile of the seed count alone); NaN
    below 2 seeds."""
    if seeds < 2:
        return math.nan
    variance = spread**2 / seeds + 0.25 / (windows * seeds)
    return float(stats.t.ppf(0.975, seeds - 1)) * math.sqrt(variance)


def _null_win_rates(runs: list[dict[str, Any]], key: str) -> list[float]:
    """The win rate of each pair of ERM runs against each other (the later seed over the
    earlier): what seed noise alone does to a win rate whose truth is 50 %."""
    return [
        statistics.fmean(sequence_wins(first[key], second[key]))
        for first, second in itertools.combinations(runs, 2)
        if first.get(key) is not None and second.get(key) is not None
    ]


def run_language_pilot(
    out_dir: str | Path,
    workers: int = 2,
    log: Callable[[str], None] = print,
    base: Config | None = None,
) -> dict[str, Any]:
    """Part (c)'s pilot, on the validation windows and with ERM alone; writes
    ``out_dir/language_pilot.json`` and returns its content.

    It pretrains the shared checkpoint, trains ERM's declared grid from pilot seed 30,
    selects by the study's rule (:func:`language_score`), and trains the selected point from
    seeds 31 and 32. It reports, changing nothing in the design:

    - whether ERM's per-layer validation losses through the LM head are already monotone
      (the share of seeds with a rise above the claims' 1 %; the monotone claim's room check
      needs at least half of the final seeds);
    - whether ERM's fine-tune improves on its start (the clean claim's fit check);
    - the win rates of the ERM runs against each other, clean and under the selection noise
      (the truth is 50 %), their RMS distance from 50 % as a seed-to-seed SD, and the expected
      half-width of the win rate's interval at the study's seed count and test size
      (:func:`expected_half_width`), against the claims' 5-point margins.

    Cost: the pretraining and 10 ERM fine-tunes, about 1.5 CPU-hours. The arguments are
    `run_depth_pilot`'s.
    """
    config = _at_pilot_seeds(base, workers)
    spec, folder = config.language, Path(out_dir)
    cache = UnitCache(
        folder / "units",
        "descent-language-pilot",
        json_ready(config),
        design=LANGUAGE_PILOT_UNIT_DESIGN,
    )
    (pretrained,) = run_units(cache, [pretraining(config)], 1, log)
    fine_tune = fine_tunes(config, pretrained["state"])
    tuning, runs, rises = _selected_at_pilot_seeds(
        cache, spec.grids()["erm"], lambda point, seed: fine_tune("erm", point, seed, False),
        lambda u: language_score(u, config.clean_tolerance), config.workers, log,
    )  # fmt: skip
    # The study's test size: its test windows, or all of them, as many as the validation
    # windows (each the same 5 % of every novel); the test split itself is not read.
    windows = spec.test_windows or len(validation_data(spec))
    seeds = len((base or Config.for_mode("full")).seeds)
    resolution = {}
    for name, key in (
        ("clean", "validation_sequence_losses"),
        (f"gamma {spec.selection_gamma:g}", "validation_noisy_sequence_losses"),
    ):
        rates = _null_win_rates(runs, key)
        spread = math.sqrt(statistics.fmean((r - 0.5) ** 2 for r in rates)) if rates else math.nan
        resolution[name] = {
            "erm_against_erm_win_rates": rates,
            "seed_sd": spread,
            "expected_half_width": expected_half_width(spread, seeds, windows),
        }
    start_perplexity = pretrained["validation_perplexity"]
    measured = ("validation_perplexity", "validation_noisy_perplexity")
    result = {
        "pretraining": {key: value for key, value in pretrained.items() if key != "state"},
        **_selection_record(tuning, measured, runs, rises),
        "erm_over_start": [run["validation_perplexity"] / start_perplexity for run in runs],
        "resolution": resolution,
        "margins": {"clean": WIN_CLEAN_MARGIN, "noise": WIN_NOISE_MARGIN},
        "windows": windows,
        "final_seeds": seeds,
    }
    log(f"language pilot: {json.dumps(json_ready(result['resolution']))}")
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomically(
        folder / "language_pilot.json", json.dumps(json_ready(result), indent=2) + "\n"
    )
    return result


def run_pilot(
    out_dir: str | Path,
    workers: int = 2,
    log: Callable[[str], None] = print,
    base: Config | None = None,
) -> dict[str, Any]:
    """Both of the study's pilots, validation only (``convergent reproduce descent --pilot``):
    the denoiser depth (`run_depth_pilot`, whose ``chosen`` and ``used`` keys this returns) and
    then part (c)'s (`run_language_pilot`, under ``"language"``; it also writes
    ``language_pilot.json``)."""
    depth = run_depth_pilot(out_dir, workers, log, base)
    return {**depth, "language": run_language_pilot(out_dir, workers, log, base)}
