"""The Villani penalties of a weight matrix, and their derivatives in its squared norm.

For a weight matrix W with n = ||W||_F^2, the two penalties are

    log-amplified:   lam * n * log(1 + n)            (= lam ||W||^2 log(1 + ||W||^2))
    super-quadratic: lam * n^(1 + eps / 2)           (= lam ||W||^(2 + eps)),  eps > 0

Both grow faster than ||W||^2, so V~ = loss + penalty satisfies Villani's condition
||grad V~||^2 / s - Laplacian V~ -> infinity as ||W|| -> infinity, which makes Langevin
dynamics on V~ ergodic with a stationary density proportional to exp(-2 V~ / s), even when the
loss alone is flat at infinity (as attention's loss is in W_Q, W_K once the softmax saturates).
`convergent.diagnostics.villani` estimates that quantity along a ray, and
`convergent.train.RegularizedStep` trains on loss + penalty.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "PENALTIES",
    "log_amplified_penalty",
    "penalty",
    "super_quadratic_penalty",
]

Penalty = Literal["log", "power"]
PENALTIES: tuple[str, ...] = ("log", "power")


def _check_lam(lam: float) -> float:
    if (
        isinstance(lam, bool)
        or not isinstance(lam, (int, float))
        or not (math.isfinite(lam) and lam >= 0)
    ):
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}.")
    return float(lam)


def _check_eps(eps: float) -> float:
    if (
        isinstance(eps, bool)
        or not isinstance(eps, (int, float))
        or not (math.isfinite(eps) and eps > 0)
    ):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}.")
    return float(eps)


def log_amplified_penalty(weight: Tensor, lam: float) -> Tensor:
    """lam * ||W||_F^2 * log(1 + ||W||_F^2), smooth everywhere (also at W = 0)."""
    lam = _check_lam(lam)
    squared = weight.pow(2).sum()
    return lam * squared * torch.log1p(squared)


def super_quadratic_penalty(weight: Tensor, lam: float, eps: float) -> Tensor:
    """lam * ||W||_F^(2 + eps), computed as lam * (||W||_F^2)^(1 + eps / 2) (smooth at 0)."""
    lam, eps = _check_lam(lam), _check_eps(eps)
    return lam * weight.pow(2).sum().pow(1 + eps / 2)


def penalty(weight: Tensor, kind: str, lam: float, eps: float = 1.0) -> Tensor:
    """The penalty `kind` ("log" or "power") of `weight`; `eps` is used by "power" only."""
    if kind == "log":
        return log_amplified_penalty(weight, lam)
    if kind == "power":
        return super_quadratic_penalty(weight, lam, eps)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {kind!r}.")


def _penalty_slope(kind: str, squared_norm: float, eps: float) -> float:
    """d penalty / d n at n = ||W||^2, per unit lam."""
    if kind == "log":
        return math.log1p(squared_norm) + squared_norm / (1 + squared_norm)
    if kind == "power":
        return (1 + eps / 2) * squared_norm ** (eps / 2)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {kind!r}.")


def _penalty_curvature(kind: str, squared_norm: float, eps: float) -> float:
    """d^2 penalty / d n^2 at n = ||W||^2, per unit lam."""
    if kind == "log":
        return 1 / (1 + squared_norm) + 1 / (1 + squared_norm) ** 2
    if kind == "power":
        return (1 + eps / 2) * (eps / 2) * squared_norm ** (eps / 2 - 1)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {kind!r}.")
