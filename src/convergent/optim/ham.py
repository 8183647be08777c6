"""HAM, Hyperbolic Aware Minimization: any base optimizer's step, then a hyperbolic mirror step.

Jacobs, Gadhikar, Rubio-Madrigal and Burkholz. After the base step, on tensors with ndim >= 2
(or as the param group's "ham_mirror" says), with the group's lr and the raw gradient:

    w <- w * exp(lr * (-alpha * sign(w) * grad - beta))

HAM shares the base optimizer's param-group dicts, so an LR scheduler on HAM drives the base
optimizer, and HAM's state_dict is the base optimizer's (its groups also carry "ham_alpha",
"ham_beta" and "ham_mirror"; "ham_skipped_steps" counts the skipped steps).

Gradients are checked before the base step: a NaN or an infinity raises, or with
nonfinite="skip" neither step runs (the base optimizer's state is untouched).

Strength: the mirror move is about lr * alpha * |w| * |grad| against a base (Adam) move of about
lr, so alpha's effect depends on the scale of both the weights and the raw gradients, and the
gradients' scale changes by orders of magnitude over a run. `ham_move_ratio` measures it, and
`convergent.train.fit` warns when HAM acts as its base optimizer. Measured at the authors'
alpha = 200 (mean mirror/Adam move ratio over short runs, ``benchmarks/strength_table.py``):
0.13 on the sparsity study's ViT (lr 1e-3), 0.031 on its character LM, 0.0045 fine-tuning
MiniLM and 0.0026 on a GPT-2 from a config: inert on all four of our models. A strength set
from the first step, as HORST's (alpha = r mean |base move| / (lr mean |w grad|)), was
measured too and is not offered: at r = 0.2 it diverged on a small ViT (its first Adam step at
lr 0.03 is larger than the weights) and blew up on the GPT-2 (alpha 2.6e5 from the first
step's small gradients, a move ratio of 2e16 once they grew). HORST, whose mirror step reads
the Adam direction instead of the raw gradient, is the scale-free variant.

Around `torch.optim.AdamW` (no amsgrad, maximize, capturable or differentiable), the compiled
implementation runs AdamW's update and the mirror step in one pass over each tensor, writing
AdamW's own state (step, exp_avg, exp_avg_sq) as AdamW would; `fused_steps` counts those
steps. exp is then, for float32 and narrower, the degree-5 polynomial where the guard's
max |grad| proves lr * (alpha * |grad| + beta) <= 1/16.
"""

from __future__ import annotations

import math
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
from convergent.optim.operators import HorstHyperparameters

_IMPLEMENTATIONS = ("auto", "foreach", "compiled")
# AdamW options the one-pass kernel does not implement: with any of them the base steps alone.
_ADAMW_FLAGS_WITHOUT_FUSION = ("amsgrad", "maximize", "capturable", "differentiable")


def _scalar_dtype() -> torch.dtype:
    """The dtype torch.optim.AdamW gives its CPU step counter (float64 under a float64
    default dtype)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


__all__ = ["HAM"]


class HAM(Optimizer):
    """Wraps `base_optimizer` with HAM's multiplicative mirror step.

    The defaults alpha = 200 and beta = 1e-3 are those of the authors' reference wrapper; at
    alpha = 200 HAM barely acts on standard-initialised Transformers (module docstring): read
    `ham_move_ratio` and raise alpha until it is 0.2 or more.

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
            which `state_dict` keeps. Under a process group all ranks decide together;
            "ignore": no check, as in torch.optim (for a loop that checks already; a NaN then
            reaches the weights and the state).
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
        self.fused_steps = 0
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
        maxima: dict[int, float] = {}
        if skip_for_nonfinite_gradient("HAM", self.param_groups, self.nonfinite, maxima):
            self.skipped_steps += 1
            return loss
        if self._fused_adamw_step(maxima):
            self.fused_steps += 1
            return loss
        if closure is None:
            self.base_optimizer.step()
        else:
            self.base_optimizer.step(_first_call_returns(loss, closure))
        with torch.no_grad():
            for group in self.param_groups:
                self._mirror_group(group)
        return loss

    def _fused_adamw_step(self, maxima: dict[int, float]) -> bool:
        """AdamW and the mirror step in one compiled pass per tensor, if the base is a plain
        `torch.optim.AdamW` and every tensor can take it; False (nothing changed) otherwise."""
        if type(self.base_optimizer) is not torch.optim.AdamW:
            return False
        plans = []
        for group in self.param_groups:
            if any(group.get(flag) for flag in _ADAMW_FLAGS_WITHOUT_FUSION):
                return False
            params = [param for param in group["params"] if param.grad is not None]
            for param in params:
                grad = cast(Tensor, param.grad)
                if (
                    param.numel() < 2
                    or param.is_complex()
                    or grad.layout != torch.strided
                    or not param.is_contiguous()
                    or not grad.is_contiguous()
                    or _sharding.local(param) is not param  # DTensor: the base steps it
                ):
                    return False
            plans.append((group, params))
        if not _fast.use_compiled(self, [p for _, params in plans for p in params], "HAM"):
            return False
        with torch.no_grad():
            for index, (group, params) in enumerate(plans):
                if not params or self._fused_group(group, params, maxima):
                    continue
                if index == 0:
                    return False  # nothing changed: the caller takes the base step
                # Earlier groups are stepped: finish the rest with AdamW's own function.
                for rest, rest_params in plans[index:]:
                    self._adamw_then_mirror(rest, rest_params)
                break
        return True

    def _adamw_then_mirror(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """AdamW's update (torch's functional form) and then the mirror step, for one group."""
        self._initial_state(group, params)
        states = [self.base_optimizer.state[param] for param in params]
        torch.optim.adamw.adamw(
            [param.detach() for param in params],
            [cast(Tensor, param.grad) for param in params],
            [state["exp_avg"] for state in states],
            [state["exp_avg_sq"] for state in states],
            [],
            [state["step"] for state in states],
            amsgrad=False,
            beta1=float(group["betas"][0]),
            beta2=float(group["betas"][1]),
            lr=float(group["lr"]),
            weight_decay=float(group["weight_decay"]),
            eps=float(group["eps"]),
            maximize=False,
        )
        self._mirror_group(group)

    def _initial_state(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """AdamW's state for parameters without one, as torch.optim.AdamW creates it (so that
        training can resume there)."""
        for param in params:
            state = self.base_optimizer.state[param]
            if len(state) == 0:
                state["step"] = (
                    torch.zeros((), dtype=torch.float32, device=param.device)
                    if group.get("fused")
                    else torch.tensor(0.0, dtype=_scalar_dtype())
                )
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    def _fused_group(
        self, group: dict[str, Any], params: list[Tensor], maxima: dict[int, float]
    ) -> bool:
        lr, (beta1, beta2) = float(group["lr"]), (float(b) for b in group["betas"])
        alpha, beta = float(group["ham_alpha"]), float(group["ham_beta"])
        mirror = group["ham_mirror"]
        flags = [param.ndim >= 2 if mirror is None else bool(mirror) for param in params]
        self._initial_state(group, params)
        steps = [float(self.base_optimizer.state[param]["step"]) + 1 for param in params]
        # HAM's exponent is lr * (-alpha * sign(w) * grad - beta), bounded by the guard's read.
        polynomial = _fast.polynomial_exp_allowed(
            params[0].dtype,
            [
                lr * (alpha * maxima.get(id(param), math.inf) + beta)
                for param, flag in zip(params, flags, strict=True)
                if flag
            ],
        )
        states = [self.base_optimizer.state[param] for param in params]
        failure = _fast.compiled_horst_step(
            [param.detach() for param in params],
            [cast(Tensor, param.grad) for param in params],
            [state["exp_avg"] for state in states],
            [state["exp_avg_sq"] for state in states],
            steps,
            flags,
            HorstHyperparameters(
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                eps=float(group["eps"]),
                weight_decay=float(group["weight_decay"]),
                alpha=lr * alpha,
                beta=beta,
                exponent_clamp=None,
            ),
            polynomial=polynomial,
            gradient_exponent=True,
        )
        if failure is not None:
            _fast.fall_back(self, failure, "HAM")
            return False
        for state in states:
            state["step"] += 1
        self.tensor_steps["compiled"] += sum(flags)
        return True

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
