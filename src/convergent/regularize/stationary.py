"""What a Villani penalty alone does to ||W||_F under Langevin dynamics with a flat loss.

`stationary_radius` is the most likely ||W||_F of the stationary density, and
`lam_for_stationary_radius` its inverse; `radial_relaxation_time` is how long ||W||_F takes to
settle there, and `diffusion_radius` how far it drifts without a penalty.
"""

from __future__ import annotations

import math

from convergent.regularize.penalties import _check_lam, _penalty_curvature, _penalty_slope

__all__ = [
    "diffusion_radius",
    "lam_for_stationary_radius",
    "radial_relaxation_time",
    "stationary_radius",
]


def lam_for_stationary_radius(
    kind: str, radius: float, numel: int, s: float, eps: float = 1.0
) -> float:
    """The lam whose penalty alone puts the most likely ||W||_F at `radius` under Langevin.

    With a flat loss, the stationary density exp(-2 lam g(||W||^2) / s) of a matrix with
    `numel` entries gives ||W||_F = r the density r^(numel - 1) exp(-2 lam g(r^2) / s),
    whose mode solves (numel - 1) = (4 lam / s) r^2 g'(r^2). This returns that lam.
    """
    if not (radius > 0 and s > 0 and numel >= 2):
        raise ValueError(
            f"radius and s must be > 0 and numel >= 2, got {radius!r}, {s!r}, {numel!r}."
        )
    squared = float(radius) ** 2
    return s * (numel - 1) / (4 * squared * _penalty_slope(kind, squared, eps))


def stationary_radius(kind: str, lam: float, numel: int, s: float, eps: float = 1.0) -> float:
    """The inverse of `lam_for_stationary_radius`: the mode of ||W||_F, inf when lam = 0."""
    lam = _check_lam(lam)
    if lam == 0:
        return math.inf
    target = s * (numel - 1) / (4 * lam)
    low, high = 0.0, 1.0
    while high**2 * _penalty_slope(kind, high**2, eps) < target:
        high *= 2
    for _ in range(100):  # r^2 g'(r^2) increases with r: bisection
        middle = (low + high) / 2
        low, high = (
            (middle, high)
            if middle**2 * _penalty_slope(kind, middle**2, eps) < target
            else (low, middle)
        )
    return (low + high) / 2


def radial_relaxation_time(kind: str, lam: float, numel: int, s: float, eps: float = 1.0) -> float:
    """How long ||W||_F takes to settle at its stationary radius under the penalty alone.

    With a flat loss, r = ||W||_F of a matrix with ``numel`` entries follows (Ito)
    dr = [s (numel - 1) / (2 r) - 2 lam r g'(r^2)] dt + sqrt(s) dB, whose drift vanishes at the
    stationary radius r*. Linearized there, r - r* decays as exp(-kappa t) with
    kappa = s (numel - 1) / r*^2 + 4 lam r*^2 g''(r*^2). Returns 1 / kappa, in the time of
    dT = -grad V dt + sqrt(s) dB: divide by the step size for steps (``Langevin`` moves
    lr time units per step). A run that tests boundedness should last several of these.

    Args:
        kind: "log" or "power".
        lam: the penalty's weight, > 0.
        numel: entries of the matrix, >= 2.
        s: the diffusion coefficient, > 0.
        eps: the super-quadratic exponent excess ("power" only).

    Returns:
        The relaxation time 1 / kappa.
    """
    if not (lam > 0 and s > 0 and numel >= 2):
        raise ValueError(
            f"lam and s must be > 0 and numel >= 2, got lam={lam!r}, s={s!r}, numel={numel!r}."
        )
    radius = stationary_radius(kind, lam, numel, s, eps)
    squared = radius**2
    kappa = s * (numel - 1) / squared + 4 * lam * squared * _penalty_curvature(kind, squared, eps)
    return 1.0 / kappa


def diffusion_radius(start_norm: float, numel: int, s: float, time: float) -> float:
    """The root-mean-square ||W||_F after ``time`` of pure noise: sqrt(start^2 + numel s time).

    Without a regularizer and with a flat loss each entry of W gains variance s per unit time
    (``Langevin`` adds N(0, lr s) per step, lr time units), so E ||W_t||^2 = ||W_0||^2 +
    numel s t: the growth an unregularized run shows from the noise alone.
    """
    if not (start_norm >= 0 and numel >= 1 and s >= 0 and time >= 0):
        raise ValueError(
            "start_norm, s and time must be >= 0 and numel >= 1, got "
            f"start_norm={start_norm!r}, numel={numel!r}, s={s!r}, time={time!r}."
        )
    return math.sqrt(start_norm**2 + numel * s * time)
