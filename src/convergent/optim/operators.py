"""The two stages of HORST as pure operators, and HORST and HAM as their compositions.

S, the steepest-descent step (AdamW's step, with torch.optim.AdamW's exact arithmetic):

    u = lr * m_hat / (sqrt(v_hat) + eps),     theta_half = theta * (1 - lr * weight_decay) - u

M, the mirror step with a mirror map (see `convergent.optim.mirror`):

    theta_next = grad_psi_star(grad_psi(theta_half) - d),  d = alpha * u + lr * beta * sign(theta_half)

With the hyperbolic entropy at scale 0 this is theta_half * exp(-alpha * sign(theta_half) * u
- lr * beta), the HORST update M∘S (Jacobs, Jain and Burkholz, 2026). Moment buffers are
updated in place, as in torch.optim; parameters are returned as new tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from convergent.optim.mirror import HyperbolicEntropyMap, MirrorMap, fits_in_place, mirror_step

__all__ = [
    "HorstHyperparameters",
    "adam_direction",
    "ham_mirror_step",
    "horst_mirror_direction",
    "horst_reference_step",
    "sign_direction",
    "steepest_descent_step",
]

_MULTIPLICATIVE = HyperbolicEntropyMap(0.0)


class HorstHyperparameters(NamedTuple):
    """The numbers of one HORST step, shared by all of a group's tensors: one value for the
    reference, foreach and compiled steps and the exponent bound (`HORST` builds it once per
    group and step).

    Attributes:
        lr: learning rate.
        beta1: first-moment decay.
        beta2: second-moment decay.
        eps: added to sqrt(v_hat).
        weight_decay: decoupled weight decay.
        alpha: strength of the mirror step.
        beta: L1 shrinkage per unit learning rate.
        exponent_clamp: None (default), or a bound c > 0 on |exponent| of the mirror step.
    """

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    alpha: float
    beta: float
    exponent_clamp: float | None = None


def adam_direction(
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    step: float,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> Tensor:
    """The Adam direction times the learning rate, with bias correction: u = lr * m_hat / (sqrt(v_hat) + eps).

    Updates `exp_avg` and `exp_avg_sq` in place with the same operations, in the same order,
    as `torch.optim.AdamW`, so that theta - u reproduces its step bit for bit.

    Args:
        grad: the gradient.
        exp_avg: first-moment buffer m, updated in place.
        exp_avg_sq: second-moment buffer v, updated in place.
        step: the step count t after incrementing (1 on the first step).
        lr: learning rate.
        beta1: first-moment decay.
        beta2: second-moment decay.
        eps: added to sqrt(v_hat).

    Returns:
        u, a new tensor.
    """
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denominator = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    # (step_size * m) / denominator is what addcdiv computes, so the subtraction matches AdamW.
    return (exp_avg * step_size).div_(denominator)


def sign_direction(grad: Tensor, *, lr: float) -> Tensor:
    """The sign-descent direction u = lr * sign(grad): Adam with beta1 = beta2 = eps = 0."""
    return torch.sign(grad).mul_(lr)


def steepest_descent_step(
    theta: Tensor, direction: Tensor, *, lr: float, weight_decay: float = 0.0
) -> Tensor:
    """S: theta_half = theta * (1 - lr * weight_decay) - direction (decoupled decay first)."""
    return theta * (1 - lr * weight_decay) - direction


def horst_mirror_direction(
    theta_half: Tensor,
    direction: Tensor,
    *,
    alpha: float,
    lr: float,
    beta: float,
    exponent_clamp: float | None = None,
) -> Tensor:
    """The dual-space step of M: d = alpha * u + lr * beta * sign(theta_half).

    With the multiplicative map, the exponent is -sign(theta_half) * d; `exponent_clamp`
    bounds |d| (hence the exponent) by a positive number.
    """
    dual_step = alpha * direction
    # + (lr * beta) * sign(theta_half), added in place where it gives the same bits (the same
    # dtype and shape as the sum would have).
    scaled_signs = torch.sign(theta_half).mul_(lr * beta)
    if fits_in_place(dual_step, scaled_signs):
        dual_step.add_(scaled_signs)
    else:
        dual_step = dual_step + scaled_signs
    if exponent_clamp is not None:
        dual_step = dual_step.clamp_(-exponent_clamp, exponent_clamp)
    return dual_step


def horst_reference_step(
    theta: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    hyperparameters: HorstHyperparameters,
    *,
    step: float,
    mirror: bool = True,
    mirror_map: MirrorMap = _MULTIPLICATIVE,
) -> Tensor:
    """One HORST step M∘S on one tensor, the readable reference.

    theta_half = theta - u - lr * weight_decay * theta;
    theta_next = theta_half * exp(-alpha * sign(theta_half) * u - lr * beta).

    Args:
        theta: the weights (not changed).
        grad: the gradient.
        exp_avg: first-moment buffer m, updated in place.
        exp_avg_sq: second-moment buffer v, updated in place.
        hyperparameters: lr, the betas, eps, weight decay, alpha, beta and exponent clamp.
        step: the step count t after incrementing (1 on the first step).
        mirror: whether to take the mirror step M; False gives theta_half.
        mirror_map: the map of M; the multiplicative map gives the update above.

    Returns:
        theta_next, a new tensor (the moments are updated in place).
    """
    lr, beta1, beta2, eps, weight_decay, alpha, beta, exponent_clamp = hyperparameters
    direction = adam_direction(
        grad, exp_avg, exp_avg_sq, step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps
    )
    theta_half = steepest_descent_step(theta, direction, lr=lr, weight_decay=weight_decay)
    if not mirror:
        return theta_half
    dual_step = horst_mirror_direction(
        theta_half, direction, alpha=alpha, lr=lr, beta=beta, exponent_clamp=exponent_clamp
    )
    return mirror_step(theta_half, dual_step, mirror_map)


def ham_mirror_step(theta: Tensor, grad: Tensor, *, lr: float, alpha: float, beta: float) -> Tensor:
    """HAM's mirror step after the base step: theta * exp(lr * (-alpha * sign(theta) * grad - beta)).

    Jacobs, Gadhikar, Rubio-Madrigal and Burkholz, "Hyperbolic Aware Minimization". Uses the
    raw gradient; returns a new tensor.
    """
    dual_step = lr * (alpha * grad + beta * torch.sign(theta))
    return mirror_step(theta, dual_step, _MULTIPLICATIVE)
