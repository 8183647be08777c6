"""Villani regularizers for Langevin training, targeted by parameter name (Frangi et al., 2026).

- `penalties`: the log-amplified and super-quadratic penalties of a weight matrix
  (`log_amplified_penalty`, `super_quadratic_penalty`, `penalty` by name; `PENALTIES`);
- `stationary`: what a penalty alone does to ||W||_F under Langevin dynamics
  (`stationary_radius`, `lam_for_stationary_radius`, `radial_relaxation_time`,
  `diffusion_radius`);
- `targets`: which parameters are penalized, by regular expression, glob or preset
  (`select_parameters`, `PRESETS`, `lora_pairs`);
- `regularizer`: `VillaniRegularizer`, one penalty summed over the targeted weights of a model.
"""

from convergent.regularize.penalties import (
    PENALTIES,
    Penalty,
    log_amplified_penalty,
    penalty,
    super_quadratic_penalty,
)
from convergent.regularize.regularizer import VillaniRegularizer
from convergent.regularize.stationary import (
    diffusion_radius,
    lam_for_stationary_radius,
    radial_relaxation_time,
    stationary_radius,
)
from convergent.regularize.targets import PRESETS, Syntax, lora_pairs, select_parameters

__all__ = [
    "PENALTIES",
    "PRESETS",
    "Penalty",
    "Syntax",
    "VillaniRegularizer",
    "diffusion_radius",
    "lam_for_stationary_radius",
    "log_amplified_penalty",
    "lora_pairs",
    "penalty",
    "radial_relaxation_time",
    "select_parameters",
    "stationary_radius",
    "super_quadratic_penalty",
]
