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
lr, so alpha's effect depends on the scale of both the weights and the gradients; the authors'
alpha = 200 moves std-0.02 weights with gradients of 1e-3 0.4 % as far as AdamW does, and
the same alpha went NaN on the sparsity study's ViT at lr 0.03. So, as HORST, HAM takes
``strength`` = r: at each group's first step (after its base step, before its mirror step)

    alpha = r * mean |base move| / (lr * mean |w * grad|)      (the group's mirrored tensors)

which makes that step's mean mirror move r times its mean base move, to first order, and its
mirror/base move ratio (of norms) at least r when the base step has one size everywhere, as
Adam's first step (about 1.6 r for normal weights and gradients, whose product's root mean
square is pi/2 times its mean |.|). The measured alpha is kept in
the group ("ham_alpha"), so `state_dict` and a resume keep it bit for bit; a group whose
mirrored weights or gradients are all zero takes no mirror step and is measured at its next
step. ``alpha`` sets the authors' parameter instead; give one of the two, neither means
``strength=DEFAULT_STRENGTH``.

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
from convergent.optim.horst import DEFAULT_STRENGTH

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

    The default beta = 1e-3 is the authors' reference wrapper's; their alpha = 200 is
    ``alpha=200.0`` here, and the default is ``strength=DEFAULT_STRENGTH`` instead (the module
    docstring says why).

    Args:
        base_optimizer: any torch optimizer (AdamW, SGD, HORST, ...), already built on the
            parameters.
        alpha: the authors' strength of the gradient term of the mirror step, >= 0; None
            (default) sets it from ``strength``.
        beta: multiplicative decay per unit learning rate, >= 0.
        strength: the first step's mirror/base move ratio r > 0 that sets alpha per group
            (module docstring). None with alpha None means `DEFAULT_STRENGTH`; give at most
            one of the two (per group: "ham_alpha" or "ham_strength").
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
        alpha: float | None = None,
        beta: float = 1e-3,
        *,
        strength: float | None = None,
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
        if alpha is not None and strength is not None:
            raise ValueError(
                f"give alpha or strength, not both; got alpha={alpha!r} and strength={strength!r}."
            )
        if alpha is None and strength is None:
            strength = DEFAULT_STRENGTH
        defaults = {
            "ham_alpha": alpha,
            "ham_strength": strength,
            "ham_beta": beta,
            "ham_mirror": mirror,
        }
        # The same dicts as the base optimizer's groups: one lr, seen by both.
        super().__init__(base_optimizer.param_groups, defaults)
        self.param_groups = base_optimizer.param_groups
        self.state = base_optimizer.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        given = [key for key in ("ham_alpha", "ham_strength") if param_group.get(key) is not None]
        if len(given) == 2:
            raise ValueError(
                f"a param group gives ham_alpha={param_group['ham_alpha']!r} and "
                f"ham_strength={param_group['ham_strength']!r}; give one of the two."
            )
        if given:  # the group's own choice replaces the optimizer's default of the other
            param_group.setdefault("ham_strength" if given[0] == "ham_alpha" else "ham_alpha", None)
        merged = {**self.defaults, **param_group}
        if merged["ham_alpha"] is not None:
            check_nonnegative("alpha", merged["ham_alpha"])
        strength = merged["ham_strength"]
        if strength is not None:
            check_nonnegative("strength", strength)
            if not strength > 0:
                raise ValueError(f"strength must be a finite number > 0, got {strength!r}.")
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
            if group.get("ham_alpha") is not None and "ham_strength" not in group:
                group["ham_strength"] = None  # an older HAM's alpha: keep it as it was
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
        unmeasured = [
            group
            for group in self.param_groups
            if group["ham_alpha"] is None and group["ham_strength"] is not None
        ]
        if not unmeasured and self._fused_adamw_step(maxima):
            self.fused_steps += 1
            return loss
        # Groups that measure alpha this step keep their weights from before the base step.
        before = {
            id(param): param.detach().clone()
            for group in unmeasured
            for param in _mirrored(group)
            if param.grad is not None
        }
        if closure is None:
            self.base_optimizer.step()
        else:
            self.base_optimizer.step(_first_call_returns(loss, closure))
        with torch.no_grad():
            for group in unmeasured:
                group["ham_alpha"] = _measured_alpha(group, before)
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
        alpha, beta = group_alpha(group), float(group["ham_beta"])
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
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            alpha=lr * alpha,
            beta=beta,
            exponent_clamp=None,
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
        alpha, beta, lr = group_alpha(group), float(group["ham_beta"]), float(group["lr"])
        if alpha == 0 and beta == 0:
            return
        buckets: dict[tuple[torch.device, torch.dtype, bool], list[Tensor]] = {}
        selected = [param for param in _mirrored(group) if param.grad is not None]
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


def group_alpha(group: dict[str, Any]) -> float:
    """The group's alpha; 0 while a strength waits for weights and gradients to measure."""
    return 0.0 if group["ham_alpha"] is None else float(group["ham_alpha"])


def _mirrored(group: dict[str, Any]) -> list[Tensor]:
    """The group's tensors that take the mirror step ("ham_mirror", else ndim >= 2)."""
    mirror = group["ham_mirror"]
    return [p for p in group["params"] if (p.ndim >= 2 if mirror is None else bool(mirror))]


def _total(value: Tensor) -> float:
    """A sum as a number; an FSDP2 (DTensor) sum over every rank's shard."""
    if _sharding.DTensor is not None and isinstance(value, _sharding.DTensor):
        value = value.full_tensor()
    return float(value)


def _measured_alpha(group: dict[str, Any], before: dict[int, Tensor]) -> float | None:
    """alpha = strength * mean |base move| / (lr * mean |w * grad|) over the group's mirrored
    tensors, right after the base step; None when either is zero (measured next step)."""
    base_total, product_total = 0.0, 0.0
    for param in _mirrored(group):
        if param.grad is None or id(param) not in before:
            continue
        weight = param.detach().double()
        base_total += _total((weight - before[id(param)].double()).abs().sum())
        product_total += _total((weight * param.grad.double()).abs().sum())
    lr = float(group["lr"])
    if base_total == 0 or product_total == 0 or lr == 0:
        return None
    return float(group["ham_strength"]) * base_total / (product_total * lr)


def _first_call_returns(loss: Any, closure: Callable[[], Any]) -> Callable[[], Any]:
    """A closure whose first call returns `loss` (already evaluated) and later calls
    `closure`."""
    calls = 0

    def evaluate() -> Any:
        nonlocal calls
        calls += 1
        return loss if calls == 1 else closure()

    return evaluate
