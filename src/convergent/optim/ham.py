"""HAM, Hyperbolic Aware Minimization: any base optimizer's step, then a hyperbolic mirror step.

Jacobs, Gadhikar, Rubio-Madrigal and Burkholz. After the base step, on tensors with ndim >= 2
(or as the param group's "ham_mirror" says), with the group's lr and the raw gradient:

    w <- w * exp(lr * (-alpha * sign(w) * grad - beta))

HAM shares the base optimizer's param-group dicts, so an LR scheduler on HAM drives the base
optimizer, and HAM's state_dict is the base optimizer's (its groups also carry "ham_alpha",
"ham_beta" and "ham_mirror"; "ham_skipped_steps" counts the skipped steps).

Gradients are checked before the base step: a NaN or an infinity raises, or with
nonfinite="skip" neither step runs (the base optimizer's state is untouched).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor
from torch.optim import Optimizer

from convergent.optim import _fast, _sharding
from convergent.optim._nonfinite import (
    Nonfinite,
    check_nonfinite_option,
    skip_for_nonfinite_gradient,
)
from convergent.optim._validation import check_nonnegative, check_optional_bool

_IMPLEMENTATIONS = ("auto", "foreach", "compiled")

__all__ = ["HAM"]


class HAM(Optimizer):
    """Wraps `base_optimizer` with HAM's multiplicative mirror step.

    The defaults alpha = 200 and beta = 1e-3 are those of the authors' reference wrapper.

    Args:
        base_optimizer: any torch optimizer (AdamW, SGD, HORST, ...), already built on the
            parameters.
        alpha: strength of the gradient term of the mirror step, >= 0.
        beta: multiplicative decay per unit learning rate, >= 0.
        mirror: which tensors get the mirror step: None (default) means ndim >= 2; True or
            False for every tensor. Per group, set "ham_mirror".
        implementation: of the mirror step: "foreach" (multi-tensor ops, one temporary per
            tensor), "compiled" (one torch.compile pass per tensor, no temporary), or "auto":
            compiled for groups of at least 2**20 elements when a compiler is available. Where
            none is, "compiled" and "auto" fall back to foreach with a one-line warning.
        nonfinite: "raise" (default): a NaN or infinite gradient raises a ValueError naming
            the parameter (by name if the base optimizer was given named parameters) before
            the base step; "skip": neither the base step nor the mirror step runs (no weight
            or base-optimizer state changes) and the step is counted in `skipped_steps`,
            which `state_dict` keeps. Under a process group all ranks decide together.
    """

    def __init__(
        self,
        base_optimizer: Optimizer,
        alpha: float = 200.0,
        beta: float = 1e-3,
        *,
        mirror: bool | None = None,
        implementation: str = "auto",
        nonfinite: Nonfinite = "raise",
    ) -> None:
        if implementation not in _IMPLEMENTATIONS:
            raise ValueError(
                f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}."
            )
        check_nonfinite_option(nonfinite)
        self.nonfinite = nonfinite
        self.skipped_steps = 0
        self.implementation = implementation
        # Which path ran the mirror step on how many tensors, and why "compiled" fell back.
        self.tensor_steps = {"foreach": 0, "compiled": 0}
        self.fallback_reason: str | None = None
        if not isinstance(base_optimizer, Optimizer):
            raise TypeError(
                f"base_optimizer must be a torch.optim.Optimizer, got {type(base_optimizer).__name__}."
            )
        self.base_optimizer = base_optimizer
        defaults = {"ham_alpha": alpha, "ham_beta": beta, "ham_mirror": mirror}
        # The same dicts as the base optimizer's groups: one lr, seen by both.
        super().__init__(base_optimizer.param_groups, defaults)
        self.param_groups = base_optimizer.param_groups
        self.state = base_optimizer.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        merged = {**self.defaults, **param_group}
        check_nonnegative("alpha", merged["ham_alpha"])
        check_nonnegative("beta", merged["ham_beta"])
        check_optional_bool("mirror", merged["ham_mirror"])
        base = self.base_optimizer
        if not any(param_group is group for group in base.param_groups):
            base.add_param_group(param_group)
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        if not any(param_group is group for group in self.param_groups):
            self.param_groups.append(param_group)

    def state_dict(self) -> dict[str, Any]:
        state = self.base_optimizer.state_dict()
        # Not "skipped_steps": a HORST base keeps its own count under that key.
        state["ham_skipped_steps"] = self.skipped_steps
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        self.skipped_steps = int(state_dict.pop("ham_skipped_steps", 0))
        self.base_optimizer.load_state_dict(state_dict)
        # Loading replaces the base optimizer's group dicts and state: share the new ones.
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state
        for group in self.param_groups:
            for name, default in self.defaults.items():
                group.setdefault(name, default)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The base optimizer's step, then the mirror step on the selected tensors.

        `closure` is evaluated here, before the gradient check; the base optimizer gets it
        back with that first evaluation's loss (a base that re-evaluates, such as LBFGS,
        calls it again for later evaluations).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if skip_for_nonfinite_gradient("HAM", self.param_groups, self.nonfinite):
            self.skipped_steps += 1
            return loss
        if closure is None:
            self.base_optimizer.step()
        else:
            self.base_optimizer.step(_first_call_returns(loss, closure))
        with torch.no_grad():
            for group in self.param_groups:
                self._mirror_group(group)
        return loss

    def _mirror_group(self, group: dict[str, Any]) -> None:
        alpha, beta, lr = float(group["ham_alpha"]), float(group["ham_beta"]), float(group["lr"])
        if alpha == 0 and beta == 0:
            return
        mirror = group["ham_mirror"]
        buckets: dict[tuple[torch.device, torch.dtype, bool], list[Tensor]] = {}
        selected = [
            param
            for param in group["params"]
            if param.grad is not None and (param.ndim >= 2 if mirror is None else mirror)
        ]
        compiled = _fast.use_compiled(self, selected, "HAM")
        grads_of: dict[int, Tensor] = {}
        for param in selected:
            # Elementwise: FSDP2 (DTensor) parameters are updated shard by shard.
            weight = _sharding.local(param.detach())
            grads_of[id(weight)] = _sharding.local(cast(Tensor, param.grad))
            fast = compiled and weight.is_contiguous() and grads_of[id(weight)].is_contiguous()
            buckets.setdefault((weight.device, weight.dtype, fast), []).append(weight)
        for (_, _, fast), weights in buckets.items():
            grads = [grads_of[id(weight)] for weight in weights]
            if fast:
                failure = _fast.compiled_ham_step(weights, grads, lr=lr, alpha=alpha, beta=beta)
                if failure is None:
                    self.tensor_steps["compiled"] += len(weights)
                    continue
                _fast.fall_back(self, failure, "HAM")
            # factor = exp(-(sign(w) * lr * (alpha * grad + beta * sign(w)))), one temporary.
            factors = torch._foreach_sign(weights)
            torch._foreach_mul_(factors, grads)
            torch._foreach_mul_(factors, -lr * alpha)
            torch._foreach_add_(factors, -lr * beta)
            torch._foreach_exp_(factors)
            torch._foreach_mul_(weights, factors)
            self.tensor_steps["foreach"] += len(weights)


def _first_call_returns(loss: Any, closure: Callable[[], Any]) -> Callable[[], Any]:
    """A closure whose first call returns `loss` (already evaluated) and later calls
    `closure`."""
    calls = 0

    def evaluate() -> Any:
        nonlocal calls
        calls += 1
        return loss if calls == 1 else closure()

    return evaluate
