"""The ``langevin`` study's lam selection (one unit per experiment, validation only): the
selection temperature, the coldest claim temperature at which the noise moves the unregularized
final validation RMSE against s = 0 by ``outcome_moved`` of its phase-1 value
(`selection_temperature`); there, for each penalty and radius factor, a phase-2 run
(`runs.langevin_run`); the smallest factor (the strongest penalty) whose final validation RMSE
is within ``selection_tolerance`` of the grid's best is selected (`selected_factor`).
"""

from __future__ import annotations

import math
from typing import Any, cast

from convergent.regularize import PENALTIES, Penalty
from convergent.studies.langevin.models import DarcyData, pretrained_model
from convergent.studies.langevin.runs import langevin_run, start_lam
from convergent.train import evaluate


def coldest_moved(moved: dict[str, float], s: dict[str, float], required: float) -> str:
    """The coldest temperature of ``moved`` (name -> how far the noise moved the outcome) whose
    move is at least ``required``; the hottest of them where none is."""
    by_s = sorted(moved, key=lambda name: s[name])
    return next((name for name in by_s if moved[name] >= required), by_s[-1])


def final_validation(
    experiment: str, base: Any, data: DarcyData, settings: dict[str, Any], **run: Any
) -> float:
    """The final validation RMSE of the selection seed's phase-2 run (``run``: kind, lam, s)."""
    seed, steps = int(settings["selection_seed"]), int(settings["langevin_steps"])
    _, _, trace = langevin_run(
        experiment, base, data, steps=steps, settings=settings, seed=seed, **run
    )
    return float(trace[-1]["validation_rmse"])


def selection_temperature(
    experiment: str, base: Any, data: DarcyData, settings: dict[str, Any], s: dict[str, float]
) -> dict[str, Any]:
    """Where lam is selected: the unregularized run at s = 0 and at each claim temperature,
    coldest first, until the noise moves the final validation RMSE by ``outcome_moved`` x the
    phase-1 validation RMSE (`coldest_moved`). Validation only: no test number enters."""
    phase1 = float(evaluate(base, data.validation, "regression")["rmse"])

    def validation(diffusion: float) -> float:
        return final_validation(experiment, base, data, settings, kind="log", lam=0.0, s=diffusion)

    required = float(settings["outcome_moved"])
    at_zero = validation(0.0)
    if not math.isfinite(at_zero):
        raise ValueError(
            f"the selection seed's {experiment} run at s = 0 diverged (validation RMSE "
            f"{at_zero}); lower langevin_lr (now {settings['langevin_lr']})."
        )
    moved: dict[str, float] = {}
    for name in sorted(settings["claim_temperatures"], key=lambda name: s[name]):
        noisy = validation(s[name])
        # a run the noise made diverge: the noise moved the outcome beyond measuring
        moved[name] = abs(noisy - at_zero) / phase1 if math.isfinite(noisy) else math.inf
        if moved[name] >= required:
            break
    return {
        "temperature": coldest_moved(moved, s, required),
        "moved": moved,
        "required": required,
        "phase1_validation_rmse": phase1,
    }


def select_lam(
    experiment: str, settings: dict[str, Any], data: DarcyData, d_model: int, s: dict[str, float]
) -> dict[str, Any]:
    """The selection temperature (`selection_temperature`) and, per penalty, the radius-factor
    grid's final validation RMSEs there and the selected factor."""
    seed = int(settings["selection_seed"])
    base = pretrained_model(experiment, data, d_model, settings, seed)
    where = selection_temperature(experiment, base, data, settings, s)
    selection_s = s[where["temperature"]]
    out: dict[str, Any] = {}
    for name in PENALTIES:
        if name not in settings["variants"]:
            continue
        kind = cast(Penalty, name)
        rows = []
        for factor in settings["radius_factors"]:
            lam = start_lam(experiment, base, kind, factor, s["hot"], settings, seed)
            rmse = final_validation(
                experiment, base, data, settings, kind=kind, lam=lam, s=selection_s
            )
            rows.append({"radius_factor": float(factor), "lam": lam, "validation_rmse": rmse})
        tolerance = float(settings["selection_tolerance"])
        out[kind] = {
            "grid": rows,
            "selected": selected_factor(rows, tolerance),
            "tolerance": tolerance,
            "temperature": where["temperature"],
        }
    return {"temperature": where, "penalties": out}


def selected_factor(rows: list[dict[str, float]], tolerance: float) -> float:
    """The smallest ``radius_factor`` among ``rows`` whose ``validation_rmse`` is at most
    (1 + tolerance) x the lowest finite one (a NaN or infinite RMSE is never selected)."""
    finite = [row for row in rows if math.isfinite(row["validation_rmse"])]
    if not finite:
        raise ValueError(
            "every radius factor's validation RMSE is NaN or infinite; no factor can be selected."
        )
    best = min(row["validation_rmse"] for row in finite)
    within = [row for row in finite if row["validation_rmse"] <= best * (1.0 + tolerance)]
    return float(min(row["radius_factor"] for row in within))
