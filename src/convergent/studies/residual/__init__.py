"""Study ``residual``: linear convergence of GD on a one-layer Transformer, and residuals at depth.

Paper: Qin, Zhou and Zhu (2025), on the convergence of gradient descent for Transformers with
residual connections. Part (a), claims 1-4 (`claims` states each): full-batch GD on
weather-hourly in fixed step-size regimes and with each beta's step size tuned on selection
seeds; part (b), claim 5: MiniLM cut or extended to a depth on rt-sentences. Modules: `config`,
`models`, `runs` (one unit's training), `study` (its parts and units), `measures` and `claims`
(scored from the stored data alone), `report`, `summary` (its summary, brief and advice).
Usage: ``convergent reproduce residual`` (or ``run_config(STUDY, Config.for_mode("quick"), out)``).
"""

from __future__ import annotations

from convergent.studies.residual.claims import DESIGN, claims_from_results
from convergent.studies.residual.config import Config
from convergent.studies.residual.study import STUDY, ResidualStudy
from convergent.studies.residual.summary import advice, brief, summary

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
