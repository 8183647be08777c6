"""The ``langevin`` study's settings: the temperatures, the lam grid and its selection rule, the
claims' thresholds and the sizes of each mode.

The modes differ only in the values of :data:`PRESETS`; every other field keeps its default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.framework import check_mode

VARIANTS = ("none", "log", "power")
# The temperature grid, hottest first: "hot" is s = 2 / N; "calibrated" samples the
# Gaussian-likelihood posterior of the averaged MSE (`convergent.optim.calibrated_s`, sigma^2 =
# the phase-1 fit's training MSE); "warm" is their geometric mean, where the noise can act
# without wrecking the fit; "cold" is calibrated / COLD_FACTOR; "zero" is s = 0, plain SGD on
# the same potential (the control).
TEMPERATURES = ("hot", "warm", "calibrated", "cold", "zero")
COLD_FACTOR = 100.0
# lam in loss units, from the radius rule at the hot temperature: the penalty alone would put the
# most likely ||W||_F at this multiple of the start norm; selected per experiment and penalty on
# validation, at the coldest claim temperature where the noise moves the selection seed's
# unregularized final validation RMSE against s = 0 by ``outcome_moved`` of its phase-1 value
# (the hottest if none does: lam selected where the noise moves nothing is tuned for plain SGD).
RADIUS_FACTORS = (1.5, 2.0, 4.0, 8.0, 16.0)
# There, the strongest penalty (smallest factor) whose final validation RMSE is within this
# fraction of the grid's best (the one-standard-error rule's idea with a declared tolerance, as
# one selection seed gives no standard error); a tenth of the accuracy claim's margin, so a
# selected penalty cannot by itself cost what that claim tests.
SELECTION_TOLERANCE = 0.005
# The gap and accuracy claims are tested at each of these, each gated by its own checks.
CLAIM_TEMPERATURES = ("hot", "warm", "calibrated")


@dataclass(frozen=True)
class Config:
    """Every choice of the study (sizes per mode in :data:`PRESETS`).

    Attributes:
        mode: "smoke", "quick" or "full".
        seeds: one run per seed (model init, data order, noise); the reported runs.
        selection_seed: the seed of the pilot, the calibration and the lam-selection runs (not
            in ``seeds``; they read the validation split only).
        pilot_steps: phase-1 steps of each regime candidate in the pilot.
        regime: the name of a pilot candidate to use without the pilot (None: run it).
        validation_fields, test_fields: sizes of the generated validation and test sets.
        pretrain_steps, pretrain_lr, pretrain_batch_size: phase 1 (AdamW, every parameter).
        langevin_steps: phase-2 steps at every temperature but the bound temperature, whose
            runs last ``relaxation_multiple`` radial relaxation times (at least
            ``langevin_steps``, at most ``max_langevin_steps``).
        langevin_lr, langevin_batch_size: phase 2 (W_Q, W_K or LoRA factors).
        temperatures: which of `TEMPERATURES` run.
        cold_factor: "cold" is the calibrated s over this.
        radius_factors: the lam grid (see `RADIUS_FACTORS`).
        power_eps: the exponent excess of the super-quadratic penalty (||W||^(2 + eps)).
        record_every: evaluation interval in phase 2, in steps.
        lora_layers, lora_rank: the LoRA variant's depth and rank.
        villani_radii, villani_probes, villani_examples: the Villani quantity along the ray
            through the final (W_Q, W_K) at the bound temperature (first seed).
        bound_temperature: where "bounded" and "grows" are tested (the noise must dominate
            the loss there for the stationary radius to apply).
        selection_tolerance, claim_temperatures: see `SELECTION_TOLERANCE`, `CLAIM_TEMPERATURES`.
        relaxation_multiple: the bound temperature's runs last this many relaxation times.
        bound_tolerance, growth_threshold, gap_margin, accuracy_margin: the bounds of claims
            1-5 (`claims`); outcome_moved, fit_kept: the bounds of their noise and fit checks
            (outcome_moved also where lam is selected, on validation).
        workers: processes for the (experiment, seed) jobs (results do not depend on it).
        threads: torch CPU threads per process.
        variants: which of `VARIANTS` run.
    """

    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    selection_seed: int = 100
    pilot_steps: int = 500
    regime: str | None = None
    validation_fields: int = 200
    test_fields: int = 1000
    pretrain_steps: int = 500
    pretrain_lr: float = 3e-3
    pretrain_batch_size: int = 64
    langevin_steps: int = 500
    max_langevin_steps: int = 1500
    langevin_lr: float = 1e-2
    langevin_batch_size: int = 128
    temperatures: tuple[str, ...] = TEMPERATURES
    cold_factor: float = COLD_FACTOR
    radius_factors: tuple[float, ...] = RADIUS_FACTORS
    power_eps: float = 1.0
    record_every: int = 50
    lora_layers: int = 2
    lora_rank: int = 4
    villani_radii: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    villani_probes: int = 4
    villani_examples: int = 128
    bound_temperature: str = "hot"
    selection_tolerance: float = SELECTION_TOLERANCE
    claim_temperatures: tuple[str, ...] = CLAIM_TEMPERATURES
    bound_tolerance: float = 0.1
    relaxation_multiple: float = 5.0
    growth_threshold: float = 0.05
    gap_margin: float = 0.02
    accuracy_margin: float = 0.05
    outcome_moved: float = 0.01
    fit_kept: float = acting.FIT_KEPT_RMSE_MULTIPLE
    threads: int = 1
    workers: int = 1
    variants: tuple[str, ...] = field(default=VARIANTS)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if not self.seeds:
            raise ValueError("seeds is empty; give at least one seed.")
        if self.selection_seed in self.seeds:
            raise ValueError(
                f"selection_seed={self.selection_seed} is one of seeds={self.seeds}; the "
                "selection seed must differ from the reported seeds."
            )
        for name in self.temperatures:
            if name not in TEMPERATURES:
                raise ValueError(f"temperature {name!r} is not one of {TEMPERATURES}.")
        for name in (self.bound_temperature, *self.claim_temperatures):
            if name not in self.temperatures:
                raise ValueError(
                    f"temperature {name!r} is not in temperatures={self.temperatures}."
                )
        if not self.claim_temperatures:
            raise ValueError(
                "claim_temperatures is empty; give at least one of the temperatures with s > 0 "
                "(lam is selected at one of them)."
            )
        if "zero" in self.claim_temperatures:
            raise ValueError(
                "claim_temperatures includes 'zero', the s = 0 control the claims are measured "
                "against; allowed are the temperatures with s > 0."
            )
        for variant in self.variants:
            if variant not in VARIANTS:
                raise ValueError(f"variant {variant!r} is not one of {VARIANTS}.")
        if not self.radius_factors or any(not factor > 1 for factor in self.radius_factors):
            raise ValueError(
                f"radius_factors={self.radius_factors} is out of range; give factors > 1."
            )
        if not 1 <= self.langevin_steps <= self.max_langevin_steps:
            raise ValueError(
                f"langevin_steps={self.langevin_steps} is out of range; allowed range is "
                f"[1, max_langevin_steps={self.max_langevin_steps}]."
            )
        if not 0 <= self.selection_tolerance < 1:
            raise ValueError(
                f"selection_tolerance={self.selection_tolerance} is out of range; allowed range "
                "is [0, 1)."
            )
        if not self.cold_factor > 1:
            raise ValueError(f"cold_factor={self.cold_factor} is out of range; it must be > 1.")

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        """smoke: seconds, for the test suite; quick: one seed, minutes; full: five seeds."""
        return cls(mode=mode, **PRESETS[check_mode(mode)])


# Processes for the quick and full modes' jobs (results do not depend on it).
WORKERS = min(2, os.cpu_count() or 1)

# The values that differ per mode; every other field keeps its default (the quick mode's).
# The full mode's seeds are new to design 7's forms (designs 1-6 read seeds 0-14); the selection
# seed 100 has read only validation data (pilot, calibration, lam grids), so the regime and the
# temperatures stay those of designs 2-6.
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "pilot_steps": 10,
        "regime": "200 fields, d_model 16",
        "validation_fields": 32,
        "test_fields": 48,
        "pretrain_steps": 20,
        "langevin_steps": 20,
        "max_langevin_steps": 40,
        "langevin_batch_size": 32,
        "radius_factors": (2.0, 4.0),
        "record_every": 10,
        "villani_radii": (1.0, 4.0),
        "villani_probes": 1,
        "villani_examples": 16,
    },
    "quick": {"workers": WORKERS},
    "full": {
        "seeds": (20, 21, 22, 23, 24),
        "pilot_steps": 2000,
        "test_fields": 4000,
        "pretrain_steps": 2000,
        "langevin_steps": 3000,
        "max_langevin_steps": 20000,
        "record_every": 200,
        "villani_probes": 8,
        "workers": WORKERS,
    },
}
