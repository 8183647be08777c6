"""How the ``descent`` study selects a method's point on its grid, on validation only.

Text (:func:`robust_score`): the best accuracy under the selection noise among the points
within a tolerance of the method's best clean accuracy. The denoiser (:func:`denoising_score`)
and the language model (:func:`language_score`): the lowest error under the selection noise
among the points where the constraints act, when any does (design 3; design 2's floor removed
every such point), within a tolerance of that pool's best clean error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from convergent.diagnostics import acting

Unit = Mapping[str, Any]


def robust_score(units: Sequence[Unit], tolerance: float) -> Callable[[Unit], float]:
    """The text selection score: validation accuracy under the selection noise, NaN (never
    selected) for a unit whose clean validation accuracy is more than ``tolerance`` below the
    best clean one among ``units`` (one method's grid)."""
    clean = [u["validation_clean"] for u in units if math.isfinite(u["validation_clean"])]
    floor = max(clean) - tolerance if clean else math.nan

    def score(unit: Unit) -> float:
        return unit["validation_robust"] if unit["validation_clean"] >= floor else math.nan

    return score


def constraints_act(unit: Unit) -> bool:
    """Whether a run's constraints acted by the claims' checks: the largest lambda during
    training at least ``acting.MULTIPLIER_FLOOR`` and some lambda positive in at least
    ``acting.ACTIVE_SHARE_FLOOR`` of the steps (never for ERM or a diverged run)."""
    peak, share = unit.get("multiplier_max"), unit.get("multiplier_active_share")
    if peak is None or share is None:
        return False
    return float(peak) >= acting.MULTIPLIER_FLOOR and float(share) >= acting.ACTIVE_SHARE_FLOOR


def denoising_score(units: Sequence[Unit], tolerance: float) -> Callable[[Unit], float]:
    """The video selection score (lower is better): validation RMSE at the selection noise;
    NaN (never selected) outside the pool (:func:`constraints_act`, or every unit when none
    does) or above (1 + ``tolerance``) x the pool's best RMSE at the training noise."""
    return _acting_floor(
        units, tolerance, "validation_rmse_train_noise", "validation_rmse_selection"
    )


def language_score(units: Sequence[Unit], tolerance: float) -> Callable[[Unit], float]:
    """Part (c)'s selection score: validation perplexity under Gaussian embedding noise, by
    the denoiser's rule on clean validation perplexity (:func:`denoising_score`)."""
    return _acting_floor(units, tolerance, "validation_perplexity", "validation_noisy_perplexity")


def _acting_floor(
    units: Sequence[Unit], tolerance: float, clean: str, shifted: str
) -> Callable[[Unit], float]:
    acted = [unit for unit in units if constraints_act(unit)]
    pool = acted or list(units)
    finite = [value for value in (u[clean] for u in pool) if math.isfinite(value)]
    ceiling = (1 + tolerance) * min(finite) if finite else math.nan

    def score(unit: Unit) -> float:
        if acted and not constraints_act(unit):
            return math.nan
        if unit[clean] <= ceiling:
            return float(unit[shifted])
        return math.nan

    return score


def selected_index(units: Sequence[Unit], score: Callable[[Unit], float]) -> int | None:
    """The index of the lowest finite ``score`` among ``units`` (ties: the first); None when no
    unit scores."""
    scored = [(score(unit), index) for index, unit in enumerate(units)]
    finite = [(value, index) for value, index in scored if math.isfinite(value)]
    return min(finite)[1] if finite else None


def revised_selection(video: Mapping[str, Any], tolerance: float) -> str:
    """What design 3's denoiser selection picks on a stored constrained grid, beside the point
    the stored final runs trained (a sentence; empty without a stored grid)."""
    grid = video.get("selection", {}).get("constrained")
    if not grid:
        return ""
    index = selected_index(grid, denoising_score(grid, tolerance))
    if index is None:
        return " On this data's grid design 3's denoiser selection finds no selectable point."
    point = grid[index]
    shown = _point(point)
    stored = _point(video["selected"]["constrained"])
    acts = (
        f"its constraints act on the selection run: largest lambda {point['multiplier_max']:.2g}, "
        f"active in {100 * point['multiplier_active_share']:.0f} % of the steps"
        if constraints_act(point)
        else "no grid point's constraints act on the selection run"
    )
    same = shown == stored
    return f" On this data's grid design 3's denoiser selection picks {shown} ({acts}); " + (
        "design 2 picked the same point."
        if same
        else f"the final runs here are of design 2's pick ({stored}), so this data cannot "
        "test the revised selection."
    )


def _point(point: Mapping[str, Any]) -> str:
    cost = point["resilient_cost"]
    return f"c {'hard' if cost is None else f'{cost:g}'}, alpha {point['alpha']:g}"
