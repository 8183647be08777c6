"""A synthetic design-7 payload of the ``langevin`` study whose answers are worked out here:
norms that saturate at a known fraction of the stationary radius or diffuse as pure noise,
linear gaps, known final RMSEs (shared by the langevin claims, checks and null tests)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

from convergent.studies.langevin import DESIGN

LR = 0.01
S = {"hot": 0.01, "calibrated": 0.001, "cold": 1e-5, "zero": 0.0}
SEEDS = (0, 1, 2)
MATRICES = {
    "attention": ("blocks.0.attn.q_proj.weight", "blocks.0.attn.k_proj.weight"),
    "lora": (
        "blocks.0.attn.q_proj.lora_A.default.weight",
        "blocks.0.attn.q_proj.lora_B.default.weight",
        "blocks.1.attn.k_proj.lora_A.default.weight",
        "blocks.1.attn.k_proj.lora_B.default.weight",
    ),
}
NUMEL = 64
BOUND_STEPS, CLAIM_STEPS, EVERY = 2000, 1000, 100
RELAXATION = 200.0  # steps: the bound runs last 10 relaxation times
RADIUS = 2.0
GRAD_RMS = 2.0  # sqrt(lr s) / (lr * 2) = 0.5 at the hot s
LABELS_STD = 0.25
PHASE1_TRAIN = 0.3  # every seed's phase-1 train RMSE
Norm = Callable[[str, int], float]


def start_norm(seed: int) -> float:
    return 1.0 + 0.1 * seed


def saturating(step: float, start: float, ceiling: float, tau: float = RELAXATION) -> float:
    """A norm relaxing to ``ceiling``: ceiling - (ceiling - start) exp(-step / tau)."""
    return ceiling - (ceiling - start) * math.exp(-step / tau)


def diffusing(step: float, start: float, s: float) -> float:
    """A matrix's norm under pure noise: sqrt(start^2 + numel s t), t = step * lr."""
    return math.sqrt(start**2 + NUMEL * s * step * LR)


# The synthetic study's answers, by seed: the log penalty's ceiling (fraction of r), the
# unregularized gap's rise over the run, the phase-1 test RMSE, the final test RMSEs.
def log_ceiling(seed: int) -> float:
    return 0.9 + 0.02 * seed


POWER_CEILING = 0.8


def gap_rise(variant: str, seed: int) -> float:
    return {"none": 0.04 + 0.01 * seed, "log": 0.002, "power": 0.001 * seed}[variant]


def pretrained_test(seed: int) -> float:
    return 0.5 + 0.05 * seed


def final_test(variant: str, seed: int) -> float:
    none = 0.6 + 0.01 * seed
    return {"none": none, "log": none * (1 + 0.01 * (seed + 1)), "power": none * 0.995}[variant]


def default_norm(variant: str, seed: int, temperature: str) -> Norm:
    """Pure diffusion without a regularizer; with one, a rise to a fraction of r at the hot
    temperature and a fall to half the start norm at the others."""
    start = start_norm(seed)
    if variant == "none" or S[temperature] == 0:
        return lambda matrix, step: diffusing(step, start, S[temperature])
    if temperature != "hot":
        return lambda matrix, step: saturating(step, start, start / 2)
    ceiling = (log_ceiling(seed) if variant == "log" else POWER_CEILING) * RADIUS
    return lambda matrix, step: saturating(step, start, ceiling)


def trace(steps: int, norm: Norm, matrices: tuple[str, ...], variant: str, seed: int) -> list:
    records = []
    for step in range(0, steps + 1, EVERY):
        gap = 0.1 + gap_rise(variant, seed) * step / steps
        test = final_test(variant, seed)
        records.append(
            {
                "step": step,
                "norms": {m: norm(m, step) for m in matrices},
                "train_rmse": test - gap,
                "validation_rmse": test,
                "test_rmse": test,
                "gap": gap,
                "grad_rms": None if step == 0 else GRAD_RMS,
            }
        )
    return records


def record(experiment: str, temperature: str, variant: str, seed: int) -> dict[str, Any]:
    s = S[temperature]
    steps = BOUND_STEPS if temperature == "hot" else CLAIM_STEPS
    matrices = MATRICES[experiment]
    plain = variant == "none" or s == 0
    return {
        "lam": 0.0 if variant == "none" else 0.5,
        "steps": steps,
        "relaxation_steps": math.nan if plain else RELAXATION,
        "stationary_radius": {m: math.inf if plain else RADIUS for m in matrices},
        "numel": dict.fromkeys(matrices, NUMEL),
        "trace": trace(steps, default_norm(variant, seed, temperature), matrices, variant, seed),
    }


def payload(
    variants: tuple[str, ...] = ("none", "log", "power"),
    claim_temperatures: tuple[str, ...] = ("calibrated",),
    moved: float = 0.02,
    null_scale: float = 1.0,
    fit_kept: float = 2.0,
) -> dict[str, Any]:
    """A design-7 payload whose claims hold. The s = 0 runs' RMSEs sit ``moved`` x the seed's
    phase-1 test RMSE below every other temperature's (the noise changed the outcome); each
    seed's penalty-only chain of log and power is its own hot run with every norm times
    ``null_scale``."""
    config = {
        "langevin_lr": LR,
        "bound_tolerance": 0.1,
        "relaxation_multiple": 5.0,
        "growth_threshold": 0.05,
        "gap_margin": 0.02,
        "accuracy_margin": 0.05,
        "outcome_moved": 0.01,
        "fit_kept": fit_kept,
        "bound_temperature": "hot",
        "claim_temperatures": list(claim_temperatures),
        "seeds": list(SEEDS),
        "variants": list(variants),
    }
    runs: dict[str, list[dict[str, Any]]] = {
        experiment: [
            {
                "seed": seed,
                "pretrained": {
                    "train_rmse": PHASE1_TRAIN,
                    "validation_rmse": 0.45,
                    "test_rmse": pretrained_test(seed),
                },
                "phase2": {t: {v: record(experiment, t, v, seed) for v in variants} for t in S},
            }
            for seed in SEEDS
        ]
        for experiment in MATRICES
    }
    for experiment_runs in runs.values():
        for run in experiment_runs:
            shift_rmse(run, "zero", variants, -moved * pretrained_test(run["seed"]))
            run["null"] = {
                p: scaled_chain(run["phase2"]["hot"][p], null_scale)
                for p in ("log", "power")
                if p in variants
            }
    data = {
        "design": DESIGN,
        "regime": {
            "name": "200 fields, d_model 16",
            "train_fields": 200,
            "d_model": 16,
            "overfit_ratio": 1.4,
            "overfit_required": 1.25,
        },
        "labels_std": LABELS_STD,
        "temperatures": dict(S),
        "noise_variance": 0.01,
        "runs": runs,
    }
    return {"config": config, "data": data}


def shift_rmse(run: dict, temperature: str, variants: Sequence[str], delta: float) -> None:
    """Move every evaluation's train, validation and test RMSE of ``variants`` at
    ``temperature`` by ``delta`` (the gap stays)."""
    for variant in variants:
        for entry in run["phase2"][temperature][variant]["trace"]:
            for key in ("train_rmse", "validation_rmse", "test_rmse"):
                entry[key] += delta


def scaled_chain(record: dict[str, Any], scale: float) -> dict[str, Any]:
    """A penalty-only chain: ``record``'s trace with every norm times ``scale``."""
    trace = copy.deepcopy(record["trace"])
    for entry in trace:
        entry["norms"] = {m: v * scale for m, v in entry["norms"].items()}
    return {"trace": trace, "stationary_radius": dict(record["stationary_radius"])}


def by_name(claims: list, experiment: str) -> dict[str, Any]:
    """The claims of one experiment, keyed by their role."""
    mine = [c for c in claims if c.statement.startswith(f"{experiment}:")]
    keys = {
        "stay bounded": "bounded",
        "norms of": "grows",
        "does not creep up": "gap bounded",
        "creeps up": "gap creeps",
        "accuracy": "accuracy",
    }
    named = {}
    for claim in mine:
        key = next(k for k in keys if k in claim.statement)
        named[keys[key]] = claim
    return named


def set_norms(data: dict, experiment: str, temperature: str, variant: str, norm: Norm) -> None:
    for run in data["runs"][experiment]:
        for r in run["phase2"][temperature][variant]["trace"]:
            r["norms"] = {m: norm(m, r["step"]) for m in r["norms"]}


def total(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values))
