"""Layer-wise descent constraints trained primal-dual.

minimize f_L subject to f_l <= (1 - alpha_l) f_{l-1}, l = 1..L, with Lagrange multipliers
updated by projected dual ascent and optional resilient relaxation (Porras-Valenzuela,
Hadou, Ribeiro, 2026). This package holds the math on per-layer losses as tensors; the
training step that runs a model lives in :mod:`convergent.train.primal_dual`, which registers
`DescentCheck` (do the constraints bind, are they met, have they settled?) for it.

Example:
    >>> constraints = DescentConstraints(num_layers=6, alpha=0.05)
    >>> dual = DualAscent(num_constraints=6, lr=0.05, resilient_cost=10.0)
    >>> slacks = constraints(losses)                     # losses: [f_0 .. f_6]
    >>> loss = lagrangian(losses[-1], slacks, dual.value(), dual.relaxation)
    >>> loss.backward(); primal_optimizer.step(); dual.step(slacks)
"""

from convergent.constrained.constraints import (
    DescentConstraints,
    check_layer_losses,
    descent_slacks,
    resolve_alpha,
)
from convergent.constrained.descent_check import DescentCheck
from convergent.constrained.dual import (
    CADENCES,
    DualAscent,
    DualCadence,
    PrimalDualResult,
    SlackAverage,
    dual_metrics,
    lagrangian,
)
from convergent.constrained.multipliers import Multipliers, ResilientRelaxation
from convergent.constrained.sampling import (
    check_token_fraction,
    inverse_probability_losses,
    sample_layers,
    sample_tokens,
)

__all__ = [
    "CADENCES",
    "DescentCheck",
    "DescentConstraints",
    "DualAscent",
    "DualCadence",
    "Multipliers",
    "PrimalDualResult",
    "ResilientRelaxation",
    "SlackAverage",
    "check_layer_losses",
    "check_token_fraction",
    "descent_slacks",
    "dual_metrics",
    "inverse_probability_losses",
    "lagrangian",
    "resolve_alpha",
    "sample_layers",
    "sample_tokens",
]
