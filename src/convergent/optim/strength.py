"""How strongly HORST's mirror step acts, in units a user can reason about.

The mirror step moves a weight by about alpha * |theta| * |u| (u the Adam step), so alpha's
effect scales with the weights' magnitude: alpha = 1 on weights of size 0.02 moves them 2 % as
far as AdamW already does, which is AdamW in all but name. Two measures say where a run stands:

- :func:`horst_move_ratio`: ||mirror move|| / ||AdamW move|| of the next step, measured;
- :func:`horst_strength`: per param group, alpha * mean |theta| over the mirrored tensors, the
  first-order estimate of that ratio, readable before training.
"""

from __future__ import annotations

import math

import torch

from convergent.optim import _sharding
from convergent.optim.horst import HORST
from convergent.optim.mirror import mirror_step
from convergent.optim.operators import horst_mirror_direction

__all__ = ["horst_move_ratio", "horst_strength"]


@torch.no_grad()
def horst_strength(optimizer: HORST) -> list[dict[str, float]]:
    """Per param group: ``alpha``, the mean ``|theta|`` of its mirrored tensors, their product
    (the first-order mirror/Adam move ratio) and the number of mirrored elements.

    Groups with no mirrored tensor report a mean of NaN.
    """
    rows = []
    for group in optimizer.param_groups:
        total, count = 0.0, 0
        for param in group["params"]:
            mirrored = param.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])
            if mirrored:
                local = _sharding.local(param).detach()
                total += float(local.abs().double().sum())
                count += local.numel()
        mean = total / count if count else math.nan
        alpha = float(group["alpha"])
        rows.append(
            {
                "alpha": alpha,
                "mean_abs": mean,
                "alpha_times_mean_abs": alpha * mean,
                "mirrored": float(count),
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
    with state concatenated. Well below 1, HORST is AdamW in all but name: at alpha = 1 the
    ratio is about the typical |theta|, e.g. 0.02 for weights of std 0.02.

    Args:
        optimizer: a HORST optimizer that has taken at least one step.

    Returns:
        The ratio, or NaN when the AdamW step would not move anything (e.g. lr 0, or no state).
    """
    mirror_squared = 0.0
    adam_squared = 0.0
    for group in optimizer.param_groups:
        beta1, beta2 = (float(value) for value in group["betas"])
        lr, eps = float(group["lr"]), float(group["eps"])
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state:
                continue
            theta = _sharding.local(param).detach().double()
            step = float(state["step"])
            exp_avg = _sharding.local(state["exp_avg"]).double()
            exp_avg_sq = _sharding.local(state["exp_avg_sq"]).double()
            denominator = (exp_avg_sq / (1 - beta2**step)).sqrt() + eps
            direction = lr * (exp_avg / (1 - beta1**step)) / denominator
            theta_half = theta - direction - lr * float(group["weight_decay"]) * theta
            adam_squared += float((theta - theta_half).square().sum())
            mirrored = param.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])
            if not mirrored:
                continue
            dual_step = horst_mirror_direction(
                theta_half,
                direction,
                alpha=float(group["alpha"]),
                lr=lr,
                beta=float(group["beta"]),
                exponent_clamp=group["exponent_clamp"],
            )
            moved = mirror_step(theta_half, dual_step, optimizer.mirror_map) - theta_half
            mirror_squared += float(moved.square().sum())
    if adam_squared == 0.0:
        return math.nan
    return math.sqrt(mirror_squared) / math.sqrt(adam_squared)
