"""The ``langevin`` study's run: the unit session, the pilot, the temperatures, each lam
selection and each (experiment, seed)'s final runs as units of the resumable `UnitCache`, then
the claims scored from the stored (JSON) data by the code that rescores a ``results.json``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from convergent.studies.framework import (
    StudyResult,
    UnitCache,
    finish,
    json_ready,
    run_jobs,
    unit_session,
)
from convergent.studies.langevin.claims import DESIGN, claims_from_results
from convergent.studies.langevin.config import Config
from convergent.studies.langevin.models import DarcyData, darcy_pool
from convergent.studies.langevin.pilot import PILOT_OVERFIT, regime_named, run_pilot
from convergent.studies.langevin.plots import plot_curves, plot_norms
from convergent.studies.langevin.report import notes_of, tables_of
from convergent.studies.langevin.runs import EXPERIMENTS, final_runs, select_lam, temperatures

# The design of this study's units (`units.UnitCache`): raise it when the study's own code
# would compute other numbers for the same config; the library's numbers are fingerprinted
# (docs/design.md, "Unit keys").
UNIT_DESIGN = 2


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run the study; figures go into `out_dir` (the caller writes report.md / results.json)."""
    with unit_session(
        "langevin", config, out_dir, config.threads, progress, design=UNIT_DESIGN
    ) as session:
        return _run(config, *session)


@dataclass(frozen=True)
class Task:
    """One unit of the study: ``function(*arguments)`` under the cache key ``key``."""

    key: dict[str, Any]
    function: Callable[..., Any]
    arguments: tuple[Any, ...]
    threads: int

    def unit(self) -> dict[str, Any]:
        return self.key


def _compute(task: Task) -> Any:
    """A task's value (a top-level function, so that a process pool can call it)."""
    torch.set_num_threads(task.threads)
    return task.function(*task.arguments)


def _run(config: Config, out: Path, log: Callable[[str], None], cache: UnitCache) -> StudyResult:
    started = time.perf_counter()
    settings = json_ready(asdict(config))

    def units(tasks: list[tuple[dict[str, Any], Callable[..., Any], tuple[Any, ...]]]) -> list:
        jobs = [
            Task(key, function, arguments, config.threads) for key, function, arguments in tasks
        ]
        return run_jobs(cache, jobs, _compute, config.workers, log)

    if config.regime is None:
        (pilot,) = units(
            [
                (
                    {"part": "pilot"},
                    run_pilot,
                    (config.pilot_steps, config.validation_fields, config.selection_seed, None),
                )
            ]
        )
        regime = regime_named(pilot["chosen"])
    else:
        pilot, regime = None, regime_named(config.regime)
    data: DarcyData = darcy_pool(
        regime["train_fields"], config.validation_fields, config.test_fields
    )
    d_model = int(regime["d_model"])
    (levels,) = units([({"part": "temperatures"}, temperatures, (settings, data, d_model))])
    selections = units(
        [
            (
                {"part": "selection", "experiment": e},
                select_lam,
                (e, settings, data, d_model, levels["s"]),
            )
            for e in EXPERIMENTS
        ]
    )
    factors = {
        e: {k: v["selected"] for k, v in chosen["penalties"].items()}
        for e, chosen in zip(EXPERIMENTS, selections, strict=True)
    }
    jobs = [
        (
            {"part": "final", "experiment": e, "seed": seed},
            final_runs,
            (e, seed, settings, data, d_model, levels["s"], factors[e]),
        )
        for seed in config.seeds
        for e in EXPERIMENTS
    ]
    outcomes = units(jobs)
    runs: dict[str, list[Any]] = {e: [] for e in EXPERIMENTS}
    for (unit, _, _), outcome in zip(jobs, outcomes, strict=True):
        runs[str(unit["experiment"])].append(outcome)
    overfit = _overfit(pilot, regime)
    data_out = {
        "design": DESIGN,
        "regime": {**regime, **overfit},
        "pilot": pilot,
        "labels_std": data.labels_std,
        "temperatures": levels["s"],
        "noise_variance": levels["noise_variance"],
        "calibration": levels,
        "selection": {
            e: chosen["penalties"] for e, chosen in zip(EXPERIMENTS, selections, strict=True)
        },
        "selection_temperature": {
            e: chosen["temperature"] for e, chosen in zip(EXPERIMENTS, selections, strict=True)
        },
        "runs": runs,
    }
    stored = json_ready(data_out)
    # Scored from the JSON form, by the same code that re-scores a committed results.json.
    claims = claims_from_results({"config": json_ready(config), "data": stored})
    figures = [*plot_norms(stored, config, out), *plot_curves(stored, out)]
    return finish(
        "langevin",
        config,
        started,
        cache.summary(),
        claims=claims,
        data=data_out,
        tables=tables_of(stored, config),
        figures=figures,
        notes=notes_of(config, stored),
    )


def _overfit(pilot: dict[str, Any] | None, regime: dict[str, Any]) -> dict[str, Any]:
    """The chosen regime's pilot ratio and the declared minimum (NaN without a pilot)."""
    row = next((r for r in (pilot or {}).get("rows", []) if r["name"] == regime["name"]), None)
    return {
        "overfit_ratio": float(row["ratio"]) if row else float("nan"),
        "overfit_required": PILOT_OVERFIT,
    }
