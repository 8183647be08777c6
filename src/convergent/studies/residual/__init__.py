"""Study ``residual``: linear convergence of GD on a one-layer Transformer, and residuals at depth.

Paper: Qin, Zhou and Zhu (2025), on the convergence of gradient descent for Transformers with
residual connections. Claims checked here, in the theorem's form and in each step-size regime:

1. Full-batch GD on a one-layer Transformer with residual connections converges linearly:
   after a stated transient the loss stays under a geometric bound (where the step size is
   within the theorem's condition: no loss rises after the transient).
2. Convergence speeds up as the residual coefficient beta goes from 0 to 1, at every step of
   beta (the log-slope of the loss over a loss band common to every beta).
3. The rate is governed by sigma_min^2 / sigma_max^2 of the attention output (log speed rises
   with its log at a slope of at least 0.5).
4. Residuals keep sigma_min away from zero where softmax collapses rank.
5. With depth (2, 6, 10 layers) the advantage of residuals grows (where both arms train above
   chance).

Parts: (a), claims 1-4, full-batch GD on weather-hourly in fixed step-size regimes and in a
regime with each beta's step size tuned on selection seeds; (b), claim 5, MiniLM cut or
extended to a depth on rt-sentences. Modules: `config` (settings and modes), `models`, `runs`
(one unit's training and measurements), `study` (its parts, for the framework's run), `measures`, `checks` and `claims`
(scored from the stored data alone), `report`, `summary` and `depth_summary` (the plain sentences a user reads
first; claim 5's in the latter), `wording` (the words summary and `brief` share). Every (regime, seed, beta) and (seed, depth, beta) run is a resumable unit.
Usage: ``convergent reproduce residual`` (or ``run_config(STUDY, Config.for_mode("quick"), out)``).
"""

from __future__ import annotations

from convergent.studies.residual.brief import advice, brief
from convergent.studies.residual.claims import DESIGN, claims_from_results
from convergent.studies.residual.config import Config
from convergent.studies.residual.study import STUDY, ResidualStudy
from convergent.studies.residual.summary import summary

__all__ = [
    "DESIGN",
    "STUDY",
    "Config",
    "ResidualStudy",
    "advice",
    "brief",
    "claims_from_results",
    "summary",
]
