"""Whether a method acted: the thresholds of the manipulation checks, read in one place.

Each method of this library acts only at a strength tied to the user's scale, and a run that
sits below it looks like any other run. Each method declares its check beside its code
(`convergent.acting`); this module gathers their thresholds and pure verdict functions, so
that the studies read the same numbers a training run checks against. Every function here
takes measured values and returns an `ActingCheck`, whose `message` is the one warning line a
run writes when the check fails.

| method | measured | acts when |
|---|---|---|
| HORST, HAM | mirror / base-step move ratio, mean over the readings | >= `MOVE_RATIO_FLOOR` |
| HAM | weights after its steps | all finite |
| Langevin | noise / gradient cumulative displacement over windows of the run's second half | >= `NOISE_DISPLACEMENT_FLOOR` |
| Langevin | train loss, latest against the first stretch | <= `FIT_KEPT_LOSS_MULTIPLE` |
| descent | largest lambda; share of steps with some lambda > 0 | >= `MULTIPLIER_FLOOR`; >= `ACTIVE_SHARE_FLOOR` |
| descent | share of steps after warm-up with every constraint met | >= `SATISFIED_SHARE_FLOOR` |
| descent | largest lambda, end against 4/5 of the run | <= `MULTIPLIER_GROWTH_LIMIT` |
| AC/DC, GMP | zeros among the prunable weights at a compressed phase's end | within `SPARSITY_TOLERANCE` |
"""

from convergent.acting import ActingCheck
from convergent.constrained.descent_check import (
    ACTIVE_SHARE_FLOOR,
    MULTIPLIER_FLOOR,
    MULTIPLIER_GROWTH_LIMIT,
    SATISFIED_SHARE_FLOOR,
    WARMUP_FRACTION,
    constraints_bind,
    constraints_met,
    multipliers_settled,
)
from convergent.optim.langevin_check import (
    FIT_KEPT_LOSS_MULTIPLE,
    FIT_KEPT_RMSE_MULTIPLE,
    NOISE_DISPLACEMENT_FLOOR,
    fit_kept,
    noise_acts,
)
from convergent.optim.mirror_check import MOVE_RATIO_FLOOR, ham_finite, mirror_acts
from convergent.sparse.sparsity_check import SPARSITY_TOLERANCE, sparsity_reached

__all__ = [
    "ACTIVE_SHARE_FLOOR",
    "FIT_KEPT_LOSS_MULTIPLE",
    "FIT_KEPT_RMSE_MULTIPLE",
    "MOVE_RATIO_FLOOR",
    "MULTIPLIER_FLOOR",
    "MULTIPLIER_GROWTH_LIMIT",
    "NOISE_DISPLACEMENT_FLOOR",
    "SATISFIED_SHARE_FLOOR",
    "SPARSITY_TOLERANCE",
    "WARMUP_FRACTION",
    "ActingCheck",
    "constraints_bind",
    "constraints_met",
    "fit_kept",
    "ham_finite",
    "mirror_acts",
    "multipliers_settled",
    "noise_acts",
    "sparsity_reached",
]
