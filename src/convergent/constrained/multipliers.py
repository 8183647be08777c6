"""Dual variables as modules: Lagrange multipliers lambda >= 0 and resilient slacks u >= 0.

Both are ``nn.Module``s, so ``.to(device)`` and ``state_dict()`` come for free and they
round-trip through a checkpoint like any other module.
"""

from __future__ import annotations

import torch
from torch import nn

SLACK_UPDATES = ("closed_form", "gradient")


class Multipliers(nn.Module):
    """One Lagrange multiplier per constraint, kept in the non-negative orthant.

    Update rule (projected dual ascent, performed by :class:`DualAscent` with any torch
    optimizer): lambda <- [lambda + eta_d * g]_+ where g estimates the constraint slack.

    Args:
        num_constraints: how many multipliers.
        init: the initial value of every multiplier (>= 0).
    """

    def __init__(self, num_constraints: int, init: float = 0.0) -> None:
        super().__init__()
        if num_constraints < 1:
            raise ValueError(f"num_constraints must be a positive integer, got {num_constraints}")
        if not init >= 0.0:
            raise ValueError(f"the initial multiplier is {init}; it must be >= 0")
        self.weight = nn.Parameter(torch.full((num_constraints,), float(init)))

    def forward(self) -> torch.Tensor:
        """The current multipliers, ``[num_constraints]``."""
        return self.weight

    @torch.no_grad()
    def project_(self) -> None:
        """Clamp every multiplier at zero (the projection onto lambda >= 0)."""
        self.weight.clamp_(min=0.0)


class ResilientRelaxation(nn.Module):
    """Resilient constraint relaxation: s_l <= u_l with u_l >= 0 at cost (c / 2) u_l^2.

    Minimizing (c / 2) u^2 - lambda u over u >= 0 gives u* = lambda / c (lambda >= 0). The
    slack follows it either exactly (``"closed_form"``) or by projected gradient steps
    u <- [u - eta_u (c u - lambda)]_+ (``"gradient"``).

    Args:
        num_constraints: how many slacks.
        cost: c > 0; large c makes the constraints nearly hard.
        update: ``"closed_form"`` or ``"gradient"``.
        lr: eta_u for ``"gradient"`` (> 0).
    """

    value: torch.Tensor

    def __init__(
        self, num_constraints: int, cost: float, update: str = "closed_form", lr: float = 0.1
    ) -> None:
        super().__init__()
        if not cost > 0.0:
            raise ValueError(f"the resilient cost c is {cost}; it must be > 0")
        if update not in SLACK_UPDATES:
            raise ValueError(f"update must be one of {', '.join(SLACK_UPDATES)}, got {update!r}")
        if not lr > 0.0:
            raise ValueError(f"the slack learning rate is {lr}; it must be > 0")
        self.cost = float(cost)
        self.update = update
        self.lr = float(lr)
        self.register_buffer("value", torch.zeros(num_constraints))

    def forward(self) -> torch.Tensor:
        """The current slacks u, ``[num_constraints]``."""
        return self.value

    def penalty(self) -> torch.Tensor:
        """(c / 2) sum_l u_l^2."""
        return 0.5 * self.cost * self.value.pow(2).sum()

    @torch.no_grad()
    def update_(self, multipliers: torch.Tensor) -> None:
        """Move u toward argmin_{u >= 0} (c / 2) u^2 - lambda u = lambda / c."""
        multipliers = multipliers.detach().to(self.value)
        if self.update == "closed_form":
            self.value.copy_(multipliers.clamp(min=0.0) / self.cost)
        else:
            step = self.value - self.lr * (self.cost * self.value - multipliers)
            self.value.copy_(step.clamp(min=0.0))

    def extra_repr(self) -> str:
        return f"cost={self.cost}, update={self.update!r}"
