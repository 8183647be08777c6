"""Study `langevin`: Langevin training of W_Q, W_K (and of LoRA factors) with Villani regularizers.

Frangi et al. (2026) claim that Langevin dynamics on attention's W_Q, W_K, with a light
log-amplified or super-quadratic regularizer, converges; that without one the norms of W_Q
and W_K grow without bound and the generalization gap creeps up; and that accuracy is about
the same either way. Design 6 tests those claims on generated Darcy flow (``darcy-gen``):

1. a pilot (phase 1 only, validation split) picks, from declared candidates, a training-set
   size and width where the model overfits (`langevin_pilot`);
2. a ViT-style regressor (one head, 4x4 patches as 16 tokens, 16 values out per patch) is
   pre-trained in full with AdamW (phase 1); then only W_Q and W_K (``attention``), or PEFT
   LoRA factors on q/k of a depth-2 model (``lora``), train under Langevin (phase 2) without a
   regularizer, with the log-amplified and with the super-quadratic penalty;
3. phase 2 runs at five temperatures: design 1's hot s = 2 / N, the calibrated s of the
   averaged MSE's posterior, warm (their geometric mean), a cold one and s = 0 (plain SGD: the
   control);
4. lam is in loss units, from the radius rule at the hot s with a factor selected on
   validation: the strongest penalty within a declared tolerance of the best validation RMSE
   (`langevin_runs`; design 3 took the best point); the bound temperature's runs last several
   radial relaxation times, and "bounded" is tested on the matrices' joint norm against the
   joint stationary radius, gated by the penalty alone run by the same chain passing the same
   criterion (`langevin_null`; design 5 took each matrix's statistic minus the chain's, designs
   2 to 4 each matrix's against its radius alone);
5. the gap and accuracy claims are tested at the hot, warm and calibrated temperatures, each
   gated by whether the noise changed the outcome against the same seed's s = 0 run and (for
   the gap) whether phase 2 kept the phase-1 fit (`langevin_checks`).

The claims and their checks are scored from the stored traces alone (`langevin_claims`);
the pilot, the temperatures, each lam selection and each (experiment, seed) are units of the
resumable `UnitCache`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from convergent.studies.framework.common import StudyResult, json_ready
from convergent.studies.framework.units import UnitCache, run_jobs, unit_session
from convergent.studies.langevin_claims import DESIGN, claims_from_results
from convergent.studies.langevin_config import VARIANTS, Config
from convergent.studies.langevin_parts import DarcyData, darcy_pool, gradient_rms
from convergent.studies.langevin_pilot import PILOT_OVERFIT, regime_named, run_pilot
from convergent.studies.langevin_plots import plot_curves, plot_norms
from convergent.studies.langevin_runs import EXPERIMENTS, final_runs, select_lam, temperatures
from convergent.studies.langevin_tables import notes_of, tables_of

__all__ = ["VARIANTS", "Config", "claims_from_results", "gradient_rms", "run"]

# The design of this study's units (`units.UnitCache`): raise it when the study's own code
# would compute other numbers for the same config; the library's numbers are fingerprinted
# (docs/design.md, "Unit keys").
UNIT_DESIGN = 1


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
        e: {k: v["selected"] for k, v in chosen.items()}
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
        "selection": dict(zip(EXPERIMENTS, selections, strict=True)),
        "runs": runs,
    }
    stored = json_ready(data_out)
    # Scored from the JSON form, by the same code that re-scores a committed results.json.
    claims = claims_from_results({"config": json_ready(config), "data": stored})
    figures = [*plot_norms(stored, config, out), *plot_curves(stored, out)]
    return StudyResult(
        name="langevin",
        mode=config.mode,
        config=replace(config),
        tables=tables_of(stored, config),
        claims=claims,
        figures=figures,
        data=data_out,
        notes=[*notes_of(config, stored), cache.summary() + "."],
        seconds=time.perf_counter() - started,
    )


def _overfit(pilot: dict[str, Any] | None, regime: dict[str, Any]) -> dict[str, Any]:
    """The chosen regime's pilot ratio and the declared minimum (NaN without a pilot)."""
    row = next((r for r in (pilot or {}).get("rows", []) if r["name"] == regime["name"]), None)
    return {
        "overfit_ratio": float(row["ratio"]) if row else float("nan"),
        "overfit_required": PILOT_OVERFIT,
    }
