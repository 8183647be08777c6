"""How strongly HORST's mirror step acts, in units a user can reason about.

The mirror step moves a weight by about alpha * |theta| * |u| (u the Adam step), so alpha's
effect scales with the weights' magnitude: alpha = 1 on weights of size 0.02 moves them 2 % as
far as AdamW already does, which is AdamW in all but name. Two measures say where a run stands:

- :func:`horst_move_ratio`: ||mirror move|| / ||AdamW move|| of the next step, measured;
- :func:`ham_move_ratio`: the same for HAM (its mirror step reads the raw gradient);
- :func:`horst_strength`: per param group, alpha * mean |theta| over the mirrored tensors, the
  first-order estimate of that ratio, readable before training.

``HORST(strength=r)`` sets alpha from r at each group's first step (see `HORST`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from convergent.optim import _sharding
from convergent.optim.ham import HAM
from convergent.optim.horst import HORST, group_alpha, is_mirrored, mirrored_mean_abs
from convergent.optim.mirror import mirror_step
from convergent.optim.operators import horst_mirror_direction

__all__ = ["ham_move_ratio", "horst_move_ratio", "horst_strength"]


@torch.no_grad()
def horst_strength(optimizer: HORST) -> list[dict[str, float]]:
    """Per param group: ``alpha`` (NaN while a strength waits to be measured), ``strength``
    (the r it was set from, NaN when alpha was given), the mean ``|theta|`` of its mirrored
    tensors that are not all zero (`mirrored_mean_abs`; under FSDP2 over the whole tensors, so
    every rank must call it),
    their product (the first-order mirror/Adam move ratio) and the number of mirrored
    elements.

    Groups with no mirrored non-zero tensor report a mean of NaN.
    """
    rows = []
    for group in optimizer.param_groups:
        mean = mirrored_mean_abs(group)
        alpha = math.nan if group["alpha"] is None else float(group["alpha"])
        strength = group.get("strength")
        mirrored = sum(param.numel() for param in group["params"] if is_mirrored(group, param))
        rows.append(
            {
                "alpha": alpha,
                "strength": math.nan if strength is None else float(strength),
                "mean_abs": math.nan if mean is None else mean,
                "alpha_times_mean_abs": alpha * (math.nan if mean is None else mean),
                "mirrored": float(mirrored),
            }
        )
    return rows


@torch.no_grad()
def horst_move_ratio(optimizer: HORST) -> float:
    """How far HORST's next mirror step would move the weights, relative to its AdamW step.

    From the optimizer's current moments (no new gradient, nothing applied), per tensor with
    state and with t its step count:

        u = lr * m_hat / (sqrt(v_hat) + eps),  m_hat = m / (1 - beta1**t),  v_hat = v / (1 - beta2**t)
        theta_half = theta - u - lr * weight_decay * theta
        mirror = theta_half * (exp(-alpha * sign(theta_half) * u - lr * beta) - 1)

    (with the group's mirror map and exponent clamp; zero for tensors the group does not
    mirror). The result is ||mirror|| / ||theta - theta_half||, both norms over all tensors
    with state concatenated (under FSDP2 over the whole tensors: every rank gets the same
    ratio). Well below 1, HORST is AdamW in all but name: at alpha = 1 the
    ratio is about the typical |theta|, e.g. 0.02 for weights of std 0.02.

    Args:
        optimizer: a HORST optimizer that has taken at least one step.

    Returns:
        The ratio, or NaN when the AdamW step would not move anything (e.g. lr 0, or no state).
    """
    mirror_squared = 0.0
    adam_squared = 0.0
    sharded = False
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state:
                continue
            sharded = sharded or _sharding.is_sharded(param)
            theta, direction = _adam_direction(group, param, state)
            # In place where a whole tensor's op has a result of its own to overwrite: the
            # same kernels on the same tensors (bit for bit), without a fresh float64 buffer
            # per operation (their page faults were most of a reading's time on MiniLM).
            theta_half = (theta - direction).sub_(lr * float(group["weight_decay"]) * theta)
            adam_squared += float((theta - theta_half).square_().sum())
            if not is_mirrored(group, param):
                continue
            dual_step = horst_mirror_direction(
                theta_half,
                direction,
                alpha=group_alpha(group),
                lr=lr,
                beta=float(group["beta"]),
                exponent_clamp=group["exponent_clamp"],
            )
            moved = mirror_step(theta_half, dual_step, optimizer.mirror_map).sub_(theta_half)
            mirror_squared += float(moved.square_().sum())
    return _ratio(mirror_squared, adam_squared, sharded)


@torch.no_grad()
def ham_move_ratio(optimizer: HAM) -> float:
    """How far HAM's next mirror step would move the weights, relative to its base step.

    HAM's mirror step reads the raw gradient, so this reads the current ``param.grad`` (in a
    loop, the last step's gradient until the next backward) and the base optimizer's Adam
    moments (AdamW or HORST as the base), per tensor with state and a gradient:

        base = lr * m_hat / (sqrt(v_hat) + eps) + lr * weight_decay * w,  w_half = w - base
        mirror = w_half * (exp(lr * (-alpha * sign(w_half) * grad - beta)) - 1)

    on the tensors the group mirrors. The result is ||mirror|| / ||base||, both over all such
    tensors (under FSDP2 over the whole tensors). The mirror move is about lr * alpha * |w| *
    |grad| against an Adam move of about lr, so it depends on the gradients' scale as well as
    the weights'.

    Args:
        optimizer: a HAM around AdamW or HORST that has taken at least one step.

    Returns:
        The ratio, or NaN when the base step would not move anything (e.g. lr 0, no state, or
        no gradient).
    """
    mirror_squared = 0.0
    base_squared = 0.0
    sharded = False
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        alpha, beta = float(group["ham_alpha"]), float(group["ham_beta"])
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state or param.grad is None or "exp_avg_sq" not in state:
                continue
            sharded = sharded or _sharding.is_sharded(param)
            weight, direction = _adam_direction(group, param, state)
            grad = _sharding.local(param.grad).double()
            base = direction + lr * float(group["weight_decay"]) * weight
            base_squared += float(base.square().sum())
            mirrored = param.ndim >= 2 if group["ham_mirror"] is None else group["ham_mirror"]
            if not mirrored:
                continue
            half = weight - base
            exponent = lr * (-alpha * torch.sign(half) * grad - beta)
            mirror_squared += float((half * torch.expm1(exponent)).square().sum())
    return _ratio(mirror_squared, base_squared, sharded)


def _adam_direction(
    group: dict[str, Any], param: Tensor, state: dict[str, Any]
) -> tuple[Tensor, Tensor]:
    """(theta, u) in float64 on the local shard: u = lr * m_hat / (sqrt(v_hat) + eps), the
    Adam direction of the next step from the current moments and step count."""
    beta1, beta2 = (float(value) for value in group["betas"])
    lr, eps, step = float(group["lr"]), float(group["eps"]), float(state["step"])
    # Copies (a float64 moment would otherwise be the state itself), then changed in place:
    # denominator = sqrt(v / (1 - beta2**t)) + eps, u = lr * (m / (1 - beta1**t)) / denominator.
    exp_avg = _sharding.local(state["exp_avg"]).to(torch.float64, copy=True)
    exp_avg_sq = _sharding.local(state["exp_avg_sq"]).to(torch.float64, copy=True)
    denominator = exp_avg_sq.div_(1 - beta2**step).sqrt_().add_(eps)
    direction = exp_avg.div_(1 - beta1**step).mul_(lr).div_(denominator)
    return _sharding.local(param).detach().double(), direction


def _ratio(mirror_squared: float, base_squared: float, sharded: bool) -> float:
    """sqrt(mirror_squared / base_squared), summed over the ranks of an FSDP2 run."""
    if sharded:  # FSDP2: each rank holds a shard of the norms; every rank gets the whole ratio
        import torch.distributed as dist

        squares = torch.tensor([mirror_squared, base_squared], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            squares = squares.cuda()
        dist.all_reduce(squares)
        mirror_squared, base_squared = (float(value) for value in squares)
    if base_squared == 0.0:
        return math.nan
    return math.sqrt(mirror_squared) / math.sqrt(base_squared)
