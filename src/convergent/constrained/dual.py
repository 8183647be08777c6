"""The dual side of primal-dual training: the Lagrangian, dual ascent and its cadence.

Lagrangian (resilient form; drop the u terms for hard constraints):

    L(theta, lambda, u) = f_L + sum_l lambda_l (s_l - u_l) + (c / 2) sum_l u_l^2.

Primal: any torch optimizer step on L w.r.t. the model. Dual (projected ascent):
lambda <- [lambda + eta_d * (s_hat - u)]_+, then u <- argmin or a gradient step toward
lambda / c. ``s_hat`` is a slack estimate: this mini-batch, a running average over the
last K steps, or a full pass over a dataset once per epoch, as the cadence says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from convergent.constrained.multipliers import Multipliers, ResilientRelaxation

CADENCES = ("step", "every", "epoch")

DualOptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]


@dataclass(frozen=True)
class DualCadence:
    """When the dual variables move.

    Attributes:
        mode: ``"step"`` (every optimizer step, on that step's mini-batch slacks),
            ``"every"`` (every ``interval`` steps, on the detached running average of the
            slacks seen since the last dual step) or ``"epoch"`` (every ``interval`` steps,
            set to the steps per epoch, on slacks measured by a full pass over a dataset).
        interval: K for ``"every"``, the steps per epoch for ``"epoch"``; 1 for ``"step"``.
    """

    mode: str = "step"
    interval: int = 1

    def __post_init__(self) -> None:
        if self.mode not in CADENCES:
            raise ValueError(f"cadence must be one of {', '.join(CADENCES)}, got {self.mode!r}")
        if isinstance(self.interval, bool) or not isinstance(self.interval, int):
            raise ValueError(f"the dual interval must be an integer, got {self.interval!r}")
        if self.interval < 1:
            raise ValueError(f"the dual interval is {self.interval}; it must be >= 1")
        if self.mode == "step" and self.interval != 1:
            raise ValueError(
                f"cadence 'step' updates every step; got interval {self.interval} "
                "(use cadence 'every' for K > 1)"
            )

    def is_due(self, step: int) -> bool:
        """Whether the dual step runs after optimizer step ``step`` (counted from 1)."""
        return step % self.interval == 0


class SlackAverage(nn.Module):
    """A running mean of detached slack estimates (sum and count kept as buffers)."""

    total: torch.Tensor
    count: torch.Tensor

    def __init__(self, num_constraints: int) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(num_constraints, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def add(self, slacks: torch.Tensor) -> None:
        """Record one estimate."""
        self.total += slacks.detach().to(self.total)
        self.count += 1

    def mean(self) -> torch.Tensor:
        """The mean of the estimates since the last :meth:`reset` (float32)."""
        if float(self.count) == 0:
            raise RuntimeError("no slack estimate was recorded since the last dual step")
        return (self.total / self.count).float()

    @torch.no_grad()
    def reset(self) -> None:
        """Forget every estimate."""
        self.total.zero_()
        self.count.zero_()


def lagrangian(
    objective: torch.Tensor,
    slacks: torch.Tensor,
    multipliers: torch.Tensor,
    relaxation: ResilientRelaxation | None = None,
) -> torch.Tensor:
    """f_L + sum_l lambda_l (s_l - u_l) + (c / 2) |u|^2, differentiable in the primal only.

    Args:
        objective: f_L (a 0-d tensor with gradient).
        slacks: ``[s_1 .. s_L]`` (with gradient).
        multipliers: lambda (treated as constants: the primal step does not move them).
        relaxation: the resilient slacks u, or None for hard constraints.
    """
    if slacks.shape != multipliers.shape:
        raise ValueError(
            f"{slacks.shape[0] if slacks.ndim else 0} slacks for {multipliers.shape[0]} "
            "multipliers; they must match"
        )
    weights = multipliers.detach().to(slacks.dtype)
    value = objective + (weights * slacks).sum()
    if relaxation is not None:
        slack = relaxation.value.to(slacks.dtype)
        value = value + relaxation.penalty().to(slacks.dtype) - (weights * slack).sum()
    return value


class DualAscent:
    """Projected dual ascent on :class:`Multipliers` with any torch optimizer.

    Torch optimizers minimize, so the multipliers' gradient is set to the negative slack
    estimate -(s_hat - u); with plain SGD and learning rate eta_d this is exactly
    lambda <- [lambda + eta_d (s_hat - u)]_+. An optimizer built with ``maximize=True`` gets
    +(s_hat - u) instead, so either convention ascends.

    Args:
        num_constraints: L.
        lr: the dual learning rate eta_d (>= 0), used by the default optimizer (SGD).
        optimizer: a factory ``params -> torch.optim.Optimizer`` for another dual optimizer.
        init: the initial multiplier value.
        resilient_cost: c > 0 turns on resilient relaxation; None keeps hard constraints.
        slack_update: ``"closed_form"`` (u = lambda / c) or ``"gradient"``.
        slack_lr: the slack step size for ``"gradient"``.
    """

    def __init__(
        self,
        num_constraints: int,
        lr: float = 0.01,
        *,
        optimizer: DualOptimizerFactory | None = None,
        init: float = 0.0,
        resilient_cost: float | None = None,
        slack_update: str = "closed_form",
        slack_lr: float = 0.1,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"the dual learning rate is {lr}; it must be >= 0")
        self.multipliers = Multipliers(num_constraints, init)
        self.relaxation = (
            None
            if resilient_cost is None
            else ResilientRelaxation(num_constraints, resilient_cost, slack_update, slack_lr)
        )
        if optimizer is None:
            self.optimizer: Optimizer = torch.optim.SGD(self.multipliers.parameters(), lr=lr)
        else:
            self.optimizer = optimizer(self.multipliers.parameters())
        for group in self.optimizer.param_groups:
            if group.get("lr", 0.0) < 0:
                raise ValueError(f"the dual learning rate is {group['lr']}; it must be >= 0")
        if self.relaxation is not None:
            self.relaxation.update_(self.multipliers.weight)

    @property
    def num_constraints(self) -> int:
        return int(self.multipliers.weight.shape[0])

    def to(self, device: torch.device | str) -> DualAscent:
        """Move the dual variables (and the optimizer state) to ``device``."""
        self.multipliers.to(device)
        if self.relaxation is not None:
            self.relaxation.to(device)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.ndim > 0:
                    state[key] = value.to(device)
        return self

    def value(self) -> torch.Tensor:
        """lambda, detached."""
        return self.multipliers.weight.detach()

    def slack(self) -> torch.Tensor | None:
        """u, or None for hard constraints."""
        return None if self.relaxation is None else self.relaxation.value.detach()

    def step(self, slack_estimate: torch.Tensor) -> None:
        """One projected ascent step on the estimate ``s_hat`` of the slacks ``[L]``."""
        slack_estimate = slack_estimate.detach()
        if slack_estimate.shape != self.multipliers.weight.shape:
            raise ValueError(
                f"slack estimate has shape {tuple(slack_estimate.shape)}; expected "
                f"({self.num_constraints},), one per constraint"
            )
        if not bool(torch.isfinite(slack_estimate).all()):
            index = int((~torch.isfinite(slack_estimate)).nonzero()[0, 0])
            raise FloatingPointError(
                f"the slack of constraint {index + 1} is {float(slack_estimate[index])}; "
                "slack estimates must be finite"
            )
        ascent = slack_estimate.to(self.multipliers.weight)
        if self.relaxation is not None:
            ascent = ascent - self.relaxation.value
        maximize = bool(self.optimizer.param_groups[0].get("maximize", False))
        self.optimizer.zero_grad(set_to_none=False)
        self.multipliers.weight.grad = ascent.clone() if maximize else -ascent
        self.optimizer.step()
        self.multipliers.project_()
        if self.relaxation is not None:
            self.relaxation.update_(self.multipliers.weight)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "multipliers": self.multipliers.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        if self.relaxation is not None:
            state["relaxation"] = self.relaxation.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.multipliers.load_state_dict(state["multipliers"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.relaxation is not None:
            if "relaxation" not in state:
                raise ValueError("the saved dual state has no resilient slacks to restore")
            self.relaxation.load_state_dict(state["relaxation"])


@dataclass(frozen=True)
class PrimalDualResult:
    """Every quantity of one primal-dual evaluation, as plain floats.

    Attributes:
        objective: f_L.
        layer_losses: f_0 .. f_L (inverse-probability estimates when layers are sampled).
        slacks: s_1 .. s_L.
        multipliers: lambda_1 .. lambda_L.
        relaxation: u_1 .. u_L, or None for hard constraints.
        lagrangian: the Lagrangian's value.
        layers: the layer indices whose losses were computed (all of them unless sampled).
    """

    objective: float
    layer_losses: tuple[float, ...]
    slacks: tuple[float, ...]
    multipliers: tuple[float, ...]
    relaxation: tuple[float, ...] | None
    lagrangian: float
    layers: tuple[int, ...]

    @classmethod
    def from_tensors(
        cls,
        layer_losses: torch.Tensor,
        slacks: torch.Tensor,
        multipliers: torch.Tensor,
        relaxation: torch.Tensor | None,
        lagrangian_value: torch.Tensor,
        layers: Iterable[int] | None = None,
    ) -> PrimalDualResult:
        losses = tuple(layer_losses.detach().float().tolist())
        return cls(
            objective=losses[-1],
            layer_losses=losses,
            slacks=tuple(slacks.detach().float().tolist()),
            multipliers=tuple(multipliers.detach().float().tolist()),
            relaxation=None if relaxation is None else tuple(relaxation.float().tolist()),
            lagrangian=float(lagrangian_value.detach()),
            layers=tuple(range(len(losses))) if layers is None else tuple(layers),
        )

    def metrics(self) -> dict[str, float]:
        """Flat floats for a metrics logger: ``objective``, ``lagrangian``, ``layer_loss_l``
        (l = 0..L, computed layers only), ``slack_l``, ``lambda_l`` and ``u_l`` (l = 1..L)."""
        flat = {"objective": self.objective, "lagrangian": self.lagrangian}
        flat.update({f"layer_loss_{i}": self.layer_losses[i] for i in self.layers})
        return flat | dual_metrics(self.multipliers, self.relaxation, self.slacks)


def dual_metrics(
    multipliers: Iterable[float],
    relaxation: Iterable[float] | None = None,
    slacks: Iterable[float] | None = None,
) -> dict[str, float]:
    """``lambda_l``, ``u_l`` and ``slack_l`` (l from 1) as flat floats."""
    flat = {f"lambda_{i}": float(v) for i, v in enumerate(multipliers, start=1)}
    if relaxation is not None:
        flat.update({f"u_{i}": float(v) for i, v in enumerate(relaxation, start=1)})
    if slacks is not None:
        flat.update({f"slack_{i}": float(v) for i, v in enumerate(slacks, start=1)})
    return flat
