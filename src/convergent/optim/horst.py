"""HORST: an AdamW step S, then a hyperbolic mirror step M (Jacobs, Jain and Burkholz, 2026).

With u = lr * m_hat / (sqrt(v_hat) + eps), the Adam direction of torch.optim.AdamW:

    theta_half = theta - u - lr * weight_decay * theta
    theta_next = theta_half * exp(-alpha * sign(theta_half) * u - lr * beta)

alpha = beta = 0 is AdamW, to float64 round-off on every implementation. The mirror step
never changes a weight's sign; zero weights do not stay zero, because S moves them first
(keeping pruned weights at zero is a mask's job, in `convergent.sparse`).

A step whose gradients hold a NaN or an infinity raises, or with nonfinite="skip" changes
nothing (weights, moments, step counts) and is counted in `skipped_steps`.

On float32 and narrower tensors, the compiled path evaluates exp by a degree-5 polynomial
where a bound proves every exponent of the step small (|x| <= 1/16, `_fast.POLYNOMIAL_EXPONENT_LIMIT`): each tensor's state keeps a
bound on max |m| / sqrt(v) (``"adam_ratio_bound"``, updated by `_fast.adam_ratio_bound`),
which bounds |u| and so the exponent. Otherwise, and on the other paths, it calls exp.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor
from torch.optim import Optimizer

from convergent.optim import _fast, _sharding
from convergent.optim._nonfinite import (
    Nonfinite,
    check_nonfinite_option,
    first_nonfinite,
    parameter_name,
    skip_for_nonfinite_gradient,
)
from convergent.optim._validation import (
    check_betas,
    check_gradient,
    check_nonnegative,
    check_optional_bool,
    check_positive_or_none,
)
from convergent.optim.mirror import HyperbolicEntropyMap, MirrorMap
from convergent.optim.operators import HorstHyperparameters, horst_reference_step

__all__ = ["DEFAULT_STRENGTH", "HORST", "first_nonfinite", "mirrored_mean_abs"]

Implementation = Literal["auto", "reference", "foreach", "compiled"]
_IMPLEMENTATIONS = ("auto", "reference", "foreach", "compiled")
# The per-tensor state key of the bound on max |m| / sqrt(v) (a float; see `_fast`).
RATIO_BOUND = "adam_ratio_bound"
# The mirror step's strength when neither alpha nor strength is given: its first step moves the
# weights about a fifth as far as the Adam step does (docs/methods.md, "Setting each method's
# strength", has the measured table and why this value).
DEFAULT_STRENGTH = 0.2


def is_mirrored(group: dict[str, Any], param: Tensor) -> bool:
    """Whether ``group`` gives ``param`` the mirror step: its "mirror" flag, else ndim >= 2."""
    return param.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])


@torch.no_grad()
def mirrored_mean_abs(group: dict[str, Any]) -> float | None:
    """mean |theta| over the group's mirrored tensors that are not all zero, or None if there is
    none.

    A tensor that is all zero (LoRA's B at initialization) is left out: it has no scale, and
    counting it would dilute the others'. An FSDP2 (DTensor) parameter is read whole, through
    its placements, so every rank gets the same value.
    """
    total, count = 0.0, 0
    for param in group["params"]:
        if not is_mirrored(group, param):
            continue
        summed = param.detach().abs().double().sum()
        if _sharding.is_dtensor(summed):
            summed = summed.full_tensor()
        value = float(summed)
        if value > 0:
            total += value
            count += param.numel()
    return total / count if count else None


def measured_ratio_bound(exp_avg: Tensor, exp_avg_sq: Tensor) -> float:
    """max |m| / sqrt(v) over a tensor's moments (0 where both are 0, inf where only v is):
    the bound's start for moments loaded without one (from torch.optim.AdamW, say)."""
    if exp_avg.numel() == 0:
        return 0.0
    magnitude = exp_avg.abs().double()
    root = exp_avg_sq.double().sqrt()
    zero = torch.zeros((), dtype=torch.float64, device=root.device)
    unbounded = torch.where(magnitude == 0, zero, torch.full_like(zero, math.inf))
    ratio = torch.where(root > 0, magnitude / root.clamp_min(1e-300), unbounded)
    return float(ratio.max())


def group_alpha(group: dict[str, Any]) -> float:
    """The group's alpha; 0 while a strength waits for a non-zero weight to measure."""
    return 0.0 if group["alpha"] is None else float(group["alpha"])


def group_hyperparameters(group: dict[str, Any]) -> HorstHyperparameters:
    """The group's numbers for one step, as floats (alpha from `group_alpha`)."""
    beta1, beta2 = (float(value) for value in group["betas"])
    return HorstHyperparameters(
        lr=float(group["lr"]),
        beta1=beta1,
        beta2=beta2,
        eps=float(group["eps"]),
        weight_decay=float(group["weight_decay"]),
        alpha=group_alpha(group),
        beta=float(group["beta"]),
        exponent_clamp=group["exponent_clamp"],
    )


class HORST(Optimizer):
    """HORST, a drop-in replacement for `torch.optim.AdamW` with a sparsity bias.

    Strength, not alpha: the mirror step moves a weight by about alpha * |theta| * |u|, so what
    alpha does depends on the weights' scale. On weights of mean magnitude 0.016 (a std-0.02
    initialization) alpha = 1 moves them 1.6 % beyond AdamW: AdamW in all but name. So HORST
    takes ``strength`` = r instead: at each group's first step it sets
    alpha = r / mean |theta| (`mirrored_mean_abs`: the group's mirrored tensors, all-zero
    tensors left out), which makes that step's mirror/Adam move ratio about r (at least r when
    the Adam step has one size everywhere, as at step 1, since the ratio reads the root mean
    square of |theta|). The measured alpha is kept in the group ("alpha"), so `state_dict`
    and a resume keep it bit for bit; a group whose mirrored tensors are all zero takes no
    mirror step (alpha 0) and is measured at the first step at which one is not. Give
    ``alpha`` instead to set the paper's parameter directly; give one of the two. Neither
    means ``strength=DEFAULT_STRENGTH`` (0.2, the manipulation check's floor).

    As HORST spreads the weights (large ones grow, small ones shrink) the measured ratio grows
    past its first step's. At the default strength (first-step ratio, then the mean ratio over
    the run, measured by ``benchmarks/strength_table.py``):

    ============================  =======  =====  =====  ==========  ===========================
    model (2026-12-04)            lr       steps  alpha  first step  mean over the run (min-max)
    ============================  =======  =====  =====  ==========  ===========================
    sparsity study's ViT          0.01     300    12.5   0.243       5.3 (0.24-14.4)
    sparsity study's char LM      0.001    300    12.5   0.249       0.34 (0.25-0.39)
    MiniLM fine-tuning            5e-5     25     4.52   0.276       0.27 (0.27-0.28)
    GPT-2 from a config (Austen)  0.001    30     13.1   0.254       0.31 (0.25-0.36)
    ============================  =======  =====  =====  ==========  ===========================

    Why 0.2: a model whose weights barely move (MiniLM at lr 5e-5) keeps its first-step ratio,
    about 1.25 r for normal weights, and that must clear the check's floor of 0.2
    (`convergent.diagnostics.acting.MOVE_RATIO_FLOOR`) with room to spare. The ``sparsity``
    study's validation selections sat at mean ratios of 0.6 to 21, and its runs above about
    50 lost the fit; where the ratio grows fast (the ViT at lr 0.01), a smaller strength
    keeps it nearer its selection (alpha 3: 0.68). `horst_strength` gives
    alpha * mean |theta| per group, `horst_move_ratio` the measured ratio of the next step, and
    `convergent.train.fit` warns when it stays below the threshold.

    Args:
        params: parameters or parameter groups, as for any torch optimizer (named
            parameters give named error messages).
        lr: learning rate, >= 0.
        betas: moment decays, each in [0, 1).
        eps: added to sqrt(v_hat), >= 0.
        weight_decay: decoupled weight decay, >= 0.
        alpha: the paper's strength of the mirror step, >= 0; its effect scales with |theta|
            (above). None (default) sets it from ``strength``.
        strength: the first step's mirror/Adam move ratio r > 0 that sets alpha =
            r / mean |theta| per group when the group first steps (above). None with alpha
            None means `DEFAULT_STRENGTH`; give at most one of alpha and strength (per group
            too: a group that sets one of them drops the other's default).
        beta: L1 shrinkage per unit learning rate, >= 0.
        mirror: which tensors get the mirror step: None (default) means those with
            ndim >= 2; True or False for all of the group. Settable per group.
        exponent_clamp: None, or a bound c > 0 with the exponent clamped to [-c, c].
        mirror_map: the map of M; `HyperbolicEntropyMap(0.0)` (default) gives the update
            above. Other maps run on the reference implementation only.
        implementation: "reference" (readable, per tensor), "foreach", "compiled" (one
            torch.compile pass per tensor), or "auto": compiled for groups of at least
            2**20 elements when a compiler is available, foreach otherwise. A compiled
            request without a compiler falls back to foreach with a one-line warning.
        nonfinite: "raise" (default): a NaN or infinite gradient raises a ValueError naming
            the parameter, before anything changes; "skip": the whole step is skipped (no
            weight, moment or step count changes) and counted in `skipped_steps`, which
            `state_dict` keeps. Under a process group all ranks decide together; "ignore": no
            check, as in torch.optim (for a loop that checks already; a NaN then reaches the
            weights and the state).
        maximize: must be False.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        alpha: float | None = None,
        beta: float = 0.0,
        *,
        strength: float | None = None,
        mirror: bool | None = None,
        exponent_clamp: float | None = None,
        mirror_map: MirrorMap | None = None,
        implementation: Implementation = "auto",
        nonfinite: Nonfinite = "raise",
        maximize: bool = False,
    ) -> None:
        if maximize:
            raise ValueError(
                "HORST supports maximize=False only, got maximize=True; negate the loss."
            )
        if implementation not in _IMPLEMENTATIONS:
            raise ValueError(
                f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}."
            )
        check_nonfinite_option(nonfinite)
        self.mirror_map = HyperbolicEntropyMap(0.0) if mirror_map is None else mirror_map
        if not isinstance(self.mirror_map, MirrorMap):
            raise TypeError(
                f"mirror_map must be a MirrorMap, got {type(self.mirror_map).__name__}."
            )
        multiplicative = (
            isinstance(self.mirror_map, HyperbolicEntropyMap) and self.mirror_map.scale == 0
        )
        if not multiplicative and implementation in ("foreach", "compiled"):
            raise ValueError(
                f"implementation={implementation!r} supports HyperbolicEntropyMap(0.0) only."
            )
        self.implementation: str = implementation if multiplicative else "reference"
        # Which path stepped how many tensors, and why "compiled" fell back to foreach (if it
        # did): the proof of which implementation really ran.
        self.tensor_steps = {"reference": 0, "foreach": 0, "compiled": 0}
        self.fallback_reason: str | None = None
        self.nonfinite = nonfinite
        self.skipped_steps = 0
        if alpha is not None and strength is not None:
            raise ValueError(
                f"give alpha or strength, not both; got alpha={alpha!r} and strength={strength!r}."
            )
        if alpha is None and strength is None:
            strength = DEFAULT_STRENGTH
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "alpha": alpha,
            "strength": strength,
            "beta": beta,
            "mirror": mirror,
            "exponent_clamp": exponent_clamp,
        }
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        given = [name for name in ("alpha", "strength") if param_group.get(name) is not None]
        if len(given) == 2:
            raise ValueError(
                f"a param group gives alpha={param_group['alpha']!r} and "
                f"strength={param_group['strength']!r}; give one of the two."
            )
        if given:  # the group's own choice replaces the optimizer's default of the other
            param_group.setdefault("strength" if given[0] == "alpha" else "alpha", None)
        merged = {**self.defaults, **param_group}
        if merged.get("maximize", False):
            raise ValueError(
                "HORST supports maximize=False only, got maximize=True; negate the loss."
            )
        for name in ("lr", "eps", "weight_decay", "beta"):
            check_nonnegative(name, merged[name])
        if merged["alpha"] is not None:
            check_nonnegative("alpha", merged["alpha"])
        strength = merged["strength"]
        if strength is not None:
            check_nonnegative("strength", strength)
            if not strength > 0:
                raise ValueError(f"strength must be a finite number > 0, got {strength!r}.")
        check_betas(merged["betas"])
        check_optional_bool("mirror", merged["mirror"])
        check_positive_or_none("exponent_clamp", merged["exponent_clamp"])
        super().add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["skipped_steps"] = self.skipped_steps
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        self.skipped_steps = int(state_dict.pop("skipped_steps", 0))
        super().load_state_dict(state_dict)
        for state in self.state.values():  # torch < 1.12 saved the step count as a number
            if "step" in state and not torch.is_tensor(state["step"]):
                state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32)
        for group in self.param_groups:  # an AdamW checkpoint lacks HORST's options
            for name, default in self.defaults.items():
                group.setdefault(name, default)
            if group["alpha"] is not None and "strength" not in group:
                group["strength"] = None  # an older HORST's alpha: keep it as it was

    def measure_alpha(self) -> None:
        """Sets alpha = strength / mean |theta| in each group that has a strength and no
        alpha yet (`mirrored_mean_abs`); `step` calls it first, so it rarely needs a call."""
        for group in self.param_groups:
            if group["alpha"] is None and group["strength"] is not None:
                scale = mirrored_mean_abs(group)
                if scale is not None:
                    group["alpha"] = float(group["strength"]) / scale

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Performs one HORST step; `closure` re-evaluates the loss and returns it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        batches: list[tuple[dict[str, Any], list[Tensor], list[Tensor]]] = []
        for group_index, group in enumerate(self.param_groups):
            params, grads = [], []
            for param_index, param in enumerate(group["params"]):
                if param.grad is None:
                    continue
                check_gradient(
                    partial(parameter_name, group, group_index, param_index), param, param.grad
                )
                params.append(param)
                grads.append(param.grad)
            batches.append((group, params, grads))
        if skip_for_nonfinite_gradient("HORST", self.param_groups, self.nonfinite):
            self.skipped_steps += 1
            return loss
        self.measure_alpha()
        for group, params, grads in batches:
            if params:
                self._update_group(group, params, grads)
        return loss

    def _update_group(
        self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]
    ) -> None:
        hyperparameters = group_hyperparameters(group)
        states = [self.state[param] for param in params]
        for state, param in zip(states, params, strict=True):
            if len(state) == 0:
                # The same state layout as torch.optim.AdamW, so its checkpoints load here.
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state[RATIO_BOUND] = 0.0
            elif RATIO_BOUND not in state:  # loaded from AdamW or an older HORST: measure it
                state[RATIO_BOUND] = measured_ratio_bound(
                    _sharding.local(state["exp_avg"]), _sharding.local(state["exp_avg_sq"])
                )
        # one multi-tensor add for every step counter, as torch.optim's foreach paths do
        torch._foreach_add_([state["step"] for state in states], 1.0)
        steps = [float(state["step"]) for state in states]
        exponent_bounds: list[float] = []
        for state, step in zip(states, steps, strict=True):
            state[RATIO_BOUND] = _fast.adam_ratio_bound(
                float(state[RATIO_BOUND]), hyperparameters.beta1, hyperparameters.beta2
            )
            exponent_bounds.append(
                _fast.horst_exponent_bound(state[RATIO_BOUND], step, hyperparameters)
            )
        flags = [is_mirrored(group, param) for param in params]
        implementation = self._resolve_implementation(params)
        if implementation == "reference":
            for param, grad, step, flag in zip(params, grads, steps, flags, strict=True):
                state = self.state[param]
                param.copy_(
                    horst_reference_step(
                        param,
                        grad,
                        state["exp_avg"],
                        state["exp_avg_sq"],
                        hyperparameters,
                        step=step,
                        mirror=flag,
                        mirror_map=self.mirror_map,
                    )
                )
            self.tensor_steps["reference"] += len(params)
            return
        # Elementwise from here on: FSDP2 (DTensor) parameters are updated shard by shard.
        local = _sharding.local
        thetas = [local(param) for param in params]
        local_grads = [local(grad) for grad in grads]
        exp_avgs = [local(self.state[param]["exp_avg"]) for param in params]
        exp_avg_sqs = [local(self.state[param]["exp_avg_sq"]) for param in params]
        buckets: dict[tuple[torch.device, torch.dtype, bool], list[int]] = {}
        for index, theta in enumerate(thetas):
            compilable = (
                implementation == "compiled"
                and theta.numel() >= 2
                and all(
                    tensor.is_contiguous()
                    for tensor in (theta, local_grads[index], exp_avgs[index], exp_avg_sqs[index])
                )
            )
            buckets.setdefault((theta.device, theta.dtype, compilable), []).append(index)
        for (_, _, compilable), indices in buckets.items():
            arguments = (
                [thetas[i] for i in indices],
                [local_grads[i] for i in indices],
                [exp_avgs[i] for i in indices],
                [exp_avg_sqs[i] for i in indices],
                [steps[i] for i in indices],
                [flags[i] for i in indices],
            )
            if compilable:
                clamp = math.inf if group["exponent_clamp"] is None else group["exponent_clamp"]
                polynomial = _fast.polynomial_exp_allowed(
                    thetas[indices[0]].dtype,
                    [min(exponent_bounds[i], float(clamp)) for i in indices if flags[i]],
                )
                failure = _fast.compiled_horst_step(
                    *arguments, hyperparameters=hyperparameters, polynomial=polynomial
                )
                if failure is None:
                    self.tensor_steps["compiled"] += len(indices)
                    continue
                _fast.fall_back(self, failure, "HORST")
            _fast.foreach_horst_step(*arguments, hyperparameters=hyperparameters)
            self.tensor_steps["foreach"] += len(indices)

    def _resolve_implementation(self, params: list[Tensor]) -> str:
        if self.implementation in ("reference", "foreach"):
            return self.implementation
        return "compiled" if _fast.use_compiled(self, params, "HORST") else "foreach"
