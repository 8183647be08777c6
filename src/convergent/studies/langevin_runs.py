"""The ``langevin`` study's jobs (designs 5 and 6): temperatures, lam selection, the final runs.

Each job is a top-level function of plain arguments (the config as a dict, the data), so that
a process pool can run it, and returns only numbers, strings, lists and dicts (a unit of the
study's cache).

1. `temperatures`: phase 1 on the selection seed (attention model); sigma^2 = its training
   MSE; s for "hot" (2 / N), "warm" (the geometric mean of hot and calibrated), "calibrated"
   (`calibrated_s`), "cold" and "zero".
2. `select_lam` (per experiment): phase 1 on the selection seed, then for each penalty and
   radius factor a phase-2 run at the selection temperature; the smallest factor (the strongest
   penalty) whose final validation RMSE is within ``selection_tolerance`` of the grid's best is
   selected (`selected_factor`; design 3 took the best point).
3. `final_runs` (per experiment and seed): phase 1, then every temperature x variant. lam is
   in loss units, set once by the radius rule at the hot s with the selected factor and kept at
   every temperature. The bound temperature's runs last ``relaxation_multiple`` radial
   relaxation times of the slowest matrix (clamped to [langevin_steps, max_langevin_steps]).
   Design 5 adds, per penalty, the penalty-only chain of the bound temperature's run
   (`langevin_null`), the null its "bounded" statistic is measured against.
"""

from __future__ import annotations

import math
from typing import Any, cast

from convergent.optim.langevin import calibrated_s
from convergent.regularize import PENALTIES, Penalty
from convergent.studies.langevin_null import null_runs
from convergent.studies.langevin_parts import (
    DarcyData,
    langevin_run,
    phase2_model,
    pretrained_model,
    radius_lam,
    scores,
    targeted,
    theory,
    villani_rows,
)

EXPERIMENTS = ("attention", "lora")


def temperatures(settings: dict[str, Any], data: DarcyData, d_model: int) -> dict[str, Any]:
    """The s of every temperature level, from the selection seed's phase-1 fit."""
    model = pretrained_model("attention", data, d_model, settings, settings["selection_seed"])
    fitted = scores(model, data)
    examples = len(data.train)
    outputs = int(data.train.tensors["labels"][0].numel())
    calibrated = calibrated_s(fitted["train_mse"], examples, outputs)
    levels = {
        "hot": 2.0 / examples,
        "warm": math.sqrt(2.0 / examples * calibrated),
        "calibrated": calibrated,
        "cold": calibrated / float(settings["cold_factor"]),
        "zero": 0.0,
    }
    return {
        "s": {name: levels[name] for name in settings["temperatures"]},
        "noise_variance": fitted["train_mse"],
        "examples": examples,
        "outputs": outputs,
        "fit": fitted,
    }


def _start_weights(experiment: str, base: Any, settings: dict, seed: int) -> dict[str, Any]:
    """The phase-2 matrices at the start of phase 2 (LoRA's A as PEFT draws it for ``seed``)."""
    model = phase2_model(experiment, base, int(settings["lora_rank"]), seed)
    return targeted(experiment, model, "log", float(settings["power_eps"])).weights()


def _lam(
    experiment: str,
    base: Any,
    kind: Penalty,
    factor: float,
    s_hot: float,
    settings: dict,
    seed: int,
) -> float:
    """The radius rule's lam for the start weights of ``base``'s phase-2 matrices."""
    weights = list(_start_weights(experiment, base, settings, seed).values())
    return radius_lam(kind, weights, factor, s_hot, float(settings["power_eps"]))


def select_lam(
    experiment: str, settings: dict[str, Any], data: DarcyData, d_model: int, s: dict[str, float]
) -> dict[str, Any]:
    """Per penalty: the radius-factor grid's final validation RMSEs and the selected factor."""
    seed = int(settings["selection_seed"])
    base = pretrained_model(experiment, data, d_model, settings, seed)
    selection_s = s[settings["selection_temperature"]]
    out: dict[str, Any] = {}
    for name in PENALTIES:
        if name not in settings["variants"]:
            continue
        kind = cast(Penalty, name)
        rows = []
        for factor in settings["radius_factors"]:
            lam = _lam(experiment, base, kind, factor, s["hot"], settings, seed)
            _, _, trace = langevin_run(
                experiment,
                base,
                data,
                kind=kind,
                lam=lam,
                s=selection_s,
                steps=int(settings["langevin_steps"]),
                settings=settings,
                seed=seed,
            )
            rows.append(
                {
                    "radius_factor": float(factor),
                    "lam": lam,
                    "validation_rmse": trace[-1]["validation_rmse"],
                }
            )
        tolerance = float(settings["selection_tolerance"])
        out[kind] = {
            "grid": rows,
            "selected": selected_factor(rows, tolerance),
            "tolerance": tolerance,
        }
    return out


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


def bound_steps(lams: dict[Penalty, float], numel: dict[str, int], s: float, settings: dict) -> int:
    """Steps for the bound temperature: relaxation_multiple x the slowest relaxation time of
    any penalty's matrices, a multiple of record_every, within [langevin_steps, max]."""
    every = int(settings["record_every"])
    longest = 0.0
    for kind, lam in lams.items():
        _, relaxation = theory(
            kind, lam, numel, s, float(settings["langevin_lr"]), float(settings["power_eps"])
        )
        if math.isfinite(relaxation):
            longest = max(longest, relaxation)
    wanted = math.ceil(float(settings["relaxation_multiple"]) * longest / every) * every
    return int(
        min(max(wanted, int(settings["langevin_steps"])), int(settings["max_langevin_steps"]))
    )


def final_runs(
    experiment: str,
    seed: int,
    settings: dict[str, Any],
    data: DarcyData,
    d_model: int,
    s: dict[str, float],
    factors: dict[Penalty, float],
) -> dict[str, Any]:
    """Phase 1 for ``seed``, then phase 2 at every temperature for every variant."""
    base = pretrained_model(experiment, data, d_model, settings, seed)
    eps, lr = float(settings["power_eps"]), float(settings["langevin_lr"])
    lams = {
        kind: _lam(experiment, base, kind, factors[kind], s["hot"], settings, seed)
        for kind in factors
    }
    start = _start_weights(experiment, base, settings, seed)
    numel = {name: int(weight.numel()) for name, weight in start.items()}
    out: dict[str, Any] = {
        "seed": seed,
        "pretrained": scores(base, data),
        "phase2": {},
        "villani": {},
    }
    for temperature, diffusion in s.items():
        steps = int(settings["langevin_steps"])
        if temperature == settings["bound_temperature"]:
            steps = bound_steps(lams, numel, diffusion, settings)
        runs: dict[str, Any] = {}
        for variant in settings["variants"]:
            kind: Penalty = "power" if variant == "power" else "log"
            lam = 0.0 if variant == "none" else lams[variant]
            model, regularizer, trace = langevin_run(
                experiment,
                base,
                data,
                kind=kind,
                lam=lam,
                s=diffusion,
                steps=steps,
                settings=settings,
                seed=seed,
            )
            radii, relaxation = theory(kind, lam, numel, diffusion, lr, eps)
            runs[variant] = {
                "lam": lam,
                "steps": steps,
                "relaxation_steps": relaxation,
                "stationary_radius": radii,
                "numel": numel,
                "trace": trace,
            }
            if experiment == "attention" and temperature == settings["bound_temperature"]:
                out["villani"][variant] = villani_rows(
                    model,
                    regularizer,
                    data.train,
                    tuple(settings["villani_radii"]),
                    diffusion,
                    int(settings["villani_probes"]),
                    int(settings["villani_examples"]),
                    seed,
                )
        out["phase2"][temperature] = runs
    bound = str(settings["bound_temperature"])
    out["null"] = null_runs(out["phase2"][bound], s[bound], settings, seed)
    return out
