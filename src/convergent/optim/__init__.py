"""Optimizers: HORST (AdamW step, then a hyperbolic mirror step), HAM, and Langevin dynamics.

HORST is the composition M∘S of two operators, both exported as pure functions:

- S, the steepest-descent step: `adam_direction` (or `sign_direction`) gives u, and
  `steepest_descent_step` applies it with decoupled weight decay;
- M, the mirror step: `mirror_step(theta, direction, mirror_map)` with a mirror map
  (`EuclideanMap`, `HyperbolicEntropyMap(scale)`); `horst_mirror_direction` gives HORST's
  dual step.

`horst_reference_step` is one HORST step on one tensor, with its numbers in one
`HorstHyperparameters`; `HORST` runs it, or its foreach or compiled equivalent, behind the
`torch.optim.Optimizer` interface. `build_optimizer(name, params, **overrides)` builds any of
them by name with the class's own defaults. `MirrorCheck` (HORST, HAM) and `LangevinCheck` are
their acting checks, registered for their types (`convergent.acting`).
"""

from convergent.optim._nonfinite import NonFiniteGradientError
from convergent.optim.factory import OPTIMIZERS, build_optimizer, decay_groups, optimizer_default
from convergent.optim.ham import HAM
from convergent.optim.horst import DEFAULT_STRENGTH, HORST, first_nonfinite, mirrored_mean_abs
from convergent.optim.langevin import (
    Langevin,
    NoiseSchedule,
    calibrated_s,
    describe_temperature,
    implied_noise_variance,
    langevin_update,
    posterior_s,
    rmsprop_denominator,
    s_from_temperature,
    temperature_from_s,
)
from convergent.optim.langevin_check import LangevinCheck  # registers Langevin's check
from convergent.optim.mirror import EuclideanMap, HyperbolicEntropyMap, MirrorMap, mirror_step
from convergent.optim.mirror_check import MirrorCheck  # registers HORST's and HAM's check
from convergent.optim.operators import (
    HorstHyperparameters,
    adam_direction,
    ham_mirror_step,
    horst_mirror_direction,
    horst_reference_step,
    sign_direction,
    steepest_descent_step,
)
from convergent.optim.strength import ham_move_ratio, horst_move_ratio, horst_strength

__all__ = [
    "DEFAULT_STRENGTH",
    "HAM",
    "HORST",
    "OPTIMIZERS",
    "EuclideanMap",
    "HorstHyperparameters",
    "HyperbolicEntropyMap",
    "Langevin",
    "LangevinCheck",
    "MirrorCheck",
    "MirrorMap",
    "NoiseSchedule",
    "NonFiniteGradientError",
    "adam_direction",
    "build_optimizer",
    "calibrated_s",
    "decay_groups",
    "describe_temperature",
    "first_nonfinite",
    "ham_mirror_step",
    "ham_move_ratio",
    "horst_mirror_direction",
    "horst_move_ratio",
    "horst_reference_step",
    "horst_strength",
    "implied_noise_variance",
    "langevin_update",
    "mirror_step",
    "mirrored_mean_abs",
    "optimizer_default",
    "posterior_s",
    "rmsprop_denominator",
    "s_from_temperature",
    "sign_direction",
    "steepest_descent_step",
    "temperature_from_s",
]
