"""Study ``langevin``: Langevin training of W_Q, W_K (and of LoRA factors) with Villani regularizers.

Frangi et al. (2026) claim that Langevin dynamics on attention's W_Q, W_K, with a light
log-amplified or super-quadratic regularizer, converges; that without one the norms of W_Q
and W_K grow without bound and the generalization gap creeps up; and that accuracy is about
the same either way. The study tests those claims on generated Darcy flow (``darcy-gen``):

1. a pilot (phase 1 only, validation split) picks, from declared candidates, a training-set
   size and width where the model overfits (`pilot`);
2. a ViT-style regressor (one head, 4x4 patches as 16 tokens, 16 values out per patch) is
   pre-trained in full with AdamW (phase 1, `models`); then only W_Q and W_K (``attention``),
   or PEFT LoRA factors on q/k of a depth-2 model (``lora``), train under Langevin (phase 2,
   `runs`) without a regularizer, with the log-amplified and with the super-quadratic penalty,
   at five temperatures: hot s = 2 / N, the calibrated s of the averaged MSE's posterior, warm
   (their geometric mean), a cold one and s = 0 (plain SGD: the control);
3. lam is in loss units, from the radius rule at the hot s with a factor selected on
   validation at the coldest claim temperature where the noise moves the validation RMSE
   against s = 0: the strongest penalty within a declared tolerance of the best validation
   RMSE; the bound temperature's runs last several radial relaxation times;
4. "bounded" is tested on the matrices' joint norm against the joint stationary radius, gated
   by the penalty alone, run by the same chain, passing the same criterion (`null`); the gap
   and accuracy ("about the same": two-sided, within a margin) claims are tested at the hot,
   warm and calibrated temperatures; every claim is gated by whether the noise changed the
   outcome it reads against the same seed's s = 0 run, and the gap and accuracy claims by
   whether phase 2 kept the phase-1 fit (`measures`).

The claims and their checks are scored from the stored traces alone (`claims`); the tables,
notes and figures are in `report` and `plots`; the plain sentences that open the report, from
the verdicts, in `summary`.
"""

from __future__ import annotations

from convergent.studies.langevin.brief import advice, brief
from convergent.studies.langevin.claims import DESIGN, claims_from_results
from convergent.studies.langevin.config import VARIANTS, Config
from convergent.studies.langevin.measures import Bound, bound_of
from convergent.studies.langevin.null import NULL_SEED_OFFSET, joint_excess, null_runs
from convergent.studies.langevin.runs import gradient_rms
from convergent.studies.langevin.study import STUDY, LangevinStudy
from convergent.studies.langevin.summary import summary

__all__ = [
    "DESIGN",
    "NULL_SEED_OFFSET",
    "STUDY",
    "VARIANTS",
    "Bound",
    "Config",
    "LangevinStudy",
    "advice",
    "bound_of",
    "brief",
    "claims_from_results",
    "gradient_rms",
    "joint_excess",
    "null_runs",
    "summary",
]
