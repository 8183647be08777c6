"""Study ``langevin``: Langevin training of W_Q, W_K (and of LoRA factors) with Villani regularizers.

Frangi et al. (2026) claim that Langevin dynamics on attention's W_Q, W_K, with a light
log-amplified or super-quadratic regularizer, converges; that without one the norms of W_Q
and W_K grow without bound and the generalization gap creeps up; and that accuracy is about
the same either way. The study tests those claims on generated Darcy flow (``darcy-gen``):

1. a pilot (phase 1 only, validation split) picks a training-set size and width where the
   model overfits (`pilot`);
2. a ViT-style regressor (one head, 4x4 patches as 16 tokens) is pre-trained with AdamW
   (phase 1, `models`); then only W_Q and W_K (``attention``), or LoRA factors on q/k of a
   depth-2 model (``lora``), train under Langevin (phase 2, `runs`) without a regularizer, with
   the log-amplified and with the super-quadratic penalty, at the temperatures of `config`
   (s = 0, plain SGD, is the control);
3. lam comes from the radius rule at the hot s with a factor selected on validation
   (`selection`);
4. the claims, their checks and the null for "bounded" are scored from the stored traces alone
   (`claims`, `checks`, `null`); the tables, notes and figures are in `report` and `plots`; the
   plain sentences, from the verdicts, in `summary` and `brief`.
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
