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
   point on validation (:func:`~convergent.studies.descent.config.denoising_score`).
2. The selected point trains from the other pilot seeds; each of the three runs' per-layer
   validation MSE at the training noise gives its largest relative rise max_l f_l / f_(l-1) - 1.
3. The first depth where the rise exceeds the claims' 1 % in at least :data:`PILOT_BUMP_SHARE`
   of the pilot seeds (two of three: above the claim's half, a margin for seed noise) is chosen,
   and the pilot stops. If none is, the pilot says so and the depth with the largest share is
   used (ties: the earlier one); the claims' own room check on test then decides.

The rule, declared before the pilot runs: design 3 keeps the 8-layer denoiser if the pilot
chooses it; otherwise the full mode's ``denoiser_layers`` becomes the pilot's ``used`` depth
before the study runs. Cost: 8 runs of 1000 denoiser steps per depth, about 10-20 CPU-minutes
at 8 layers and 1.5 times that at 12. Run it with ``run_pilot(OUT / "descent-pilot")`` and
keep its result as ``pilot.json`` there, as ``convergent reproduce sparsity --pilot`` does for
the sparsity pilot (same signature, same ``chosen`` and ``used`` keys).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convergent.studies.descent.claims import MONOTONE_TOLERANCE, largest_relative_increase
from convergent.studies.descent.config import Config, denoising_score, selected_index
from convergent.studies.descent.runs import Job, video_unit
from convergent.studies.framework import UnitCache, grid_points, json_ready, run_jobs

PILOT_DEPTHS = (8, 12)
PILOT_SEEDS = (30, 31, 32)  # no earlier design read seeds 20 and up; the study runs 20-25
PILOT_BUMP_SHARE = 2 / 3  # above the claims' BUMP_SHARE_FLOOR (1/2)
# The pilot's own unit design: raise it when its units would compute other numbers.
PILOT_UNIT_DESIGN = 1


def pilot_config(layers: int, base: Config | None = None, workers: int = 2) -> Config:
    """``base`` (the full mode's config by default) with ``layers`` denoiser layers, the
    first pilot seed as its selection seed and the others as its seeds."""
    return dataclasses.replace(
        base or Config.for_mode("full"),
        denoiser_layers=layers,
        selection_seed=PILOT_SEEDS[0],
        seeds=PILOT_SEEDS[1:],
        workers=workers,
    )


def timed_video_unit(job: Job) -> dict[str, Any]:
    """`video_unit` and its wall time in seconds."""
    start = time.perf_counter()
    unit = video_unit(job)
    return {**unit, "seconds": time.perf_counter() - start}


def _depth(config: Config, out_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """One candidate depth: ERM's grid, its selected point from every pilot seed, the rises."""
    cache = UnitCache(
        out_dir / "units", "descent-pilot", json_ready(config), design=PILOT_UNIT_DESIGN
    )
    points = grid_points(config.grids()["erm"])
    grid = [
        Job(config, "video", "erm", dict(point), PILOT_SEEDS[0], final=False) for point in points
    ]
    units = run_jobs(cache, grid, timed_video_unit, config.workers, log)
    index = selected_index(units, denoising_score(units, config.clean_tolerance))
    index = 0 if index is None else index  # every point diverged: the report shows it
    others = [dataclasses.replace(grid[index], seed=seed) for seed in PILOT_SEEDS[1:]]
    runs = [units[index], *run_jobs(cache, others, timed_video_unit, config.workers, log)]
    rises = [
        largest_relative_increase(run["layer_losses"]) if "layer_losses" in run else math.nan
        for run in runs
    ]
    share = sum(rise > MONOTONE_TOLERANCE for rise in rises) / len(rises)
    seconds = [unit["seconds"] for unit in [*units, *runs[1:]]]
    log(f"pilot {config.denoiser_layers} layers: {dict(points[index])}, rises {rises}")
    return {
        "layers": config.denoiser_layers,
        "grid": [
            {
                **point,
                "validation_rmse_train_noise": unit["validation_rmse_train_noise"],
                "validation_rmse_selection": unit["validation_rmse_selection"],
                "seconds": unit["seconds"],
            }
            for point, unit in zip(points, units, strict=True)
        ],
        "selected": dict(points[index]),
        "seeds": list(PILOT_SEEDS),
        "layer_losses": [run.get("layer_losses") for run in runs],
        "largest_rise": rises,
        "bump_share": share,
        "seconds_per_run": sum(seconds) / len(seconds),
    }


def run_pilot(
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
