"""Is a loss curve converging linearly? Bound form, fitted rate, and speed over a band.

Linear convergence theorems (e.g. gradient descent on a one-layer Transformer with residual
connections) are bounds, L_t - L* <= rho^t (L_0 - L*), not a claim that log(L_t - L*) is a
straight line. Each tool here answers one question about a curve (a 1-D array or sequence,
optionally with ``steps`` for curves logged every k steps):

* Does the curve satisfy the bound? `geometric_envelope` tests the gap against the geometric
  envelope through the window's first and last points; `smallest_envelope_rate` gives the
  tightest rho the curve satisfies (its certified rate). A fast transient followed by slow
  decay passes; a plateau followed by a drop fails.
* What rate does it decay at? The fits are in `rates`: `fit_linear_rate` for a known floor,
  `fit_rate_with_floor` (L* + C exp(-k t), nonlinear least squares) when L* is unknown, and
  `fit_saturation` where a rising curve levels off (a norm under a regularizer).
* Which of several curves is faster? `steps_to_reach` and `band_log_slope` compare curves
  that start at different losses over a common loss band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The fits are `rates`'; imported here too, so that either module's path finds them.
from convergent.diagnostics.rates import (
    FloorFit,
    curve_arrays,
    fit_rate_with_floor,
    fit_saturation,
)

__all__ = [
    "BandSlope",
    "EnvelopeTest",
    "FloorFit",
    "band_log_slope",
    "fit_rate_with_floor",
    "fit_saturation",
    "geometric_envelope",
    "smallest_envelope_rate",
    "steps_to_reach",
]

# Slack, in log units (a relative 1e-9 on the gap), that absorbs floating-point rounding so
# that an exact geometric curve satisfies its own envelope.
_ROUNDING = 1e-9


@dataclass(frozen=True)
class EnvelopeTest:
    """Whether a curve's gap stays under the geometric envelope through its window's ends.

    Attributes:
        holds: every point's log-gap is at most its log-envelope plus the tolerance.
        rate: rho = (g_T / g_t0)^(1 / (T - t0)), the envelope's per-step factor.
        worst_excess: max of log(g_t) - log(envelope_t) over the points other than the two
            that define the envelope (which lie on it); <= 0 when the bound holds, -inf when a
            window has no other usable point, +inf when a loss is NaN or +inf.
        worst_step: the step where ``worst_excess`` is attained.
        start_step: t0, the window's first step.
        end_step: T, the last step with a positive, finite gap.
    """

    holds: bool
    rate: float
    worst_excess: float
    worst_step: float
    start_step: float
    end_step: float


@dataclass(frozen=True)
class BandSlope:
    """The mean slope of log(loss) while the curve falls through the band [low, high].

    Attributes:
        high, low: the band's edges.
        high_step, low_step: the steps at which the curve reaches ``high`` and ``low``
            (`steps_to_reach`; inf when never reached).
        slope: (log(low) - log(high)) / (low_step - high_step), negative when falling; NaN
            when the curve never reaches ``low`` or starts below ``high``.
    """

    high: float
    low: float
    high_step: float
    low_step: float
    slope: float

    @property
    def rate(self) -> float:
        """exp(slope): the mean per-step factor of the loss within the band."""
        return math.exp(self.slope)


def _window_gaps(
    losses: Sequence[float] | np.ndarray,
    start: int,
    steps: Sequence[float] | np.ndarray | None,
    floor: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window's steps, gaps L_t - floor and usable mask; validates the window."""
    values, positions = curve_arrays(losses, steps)
    if not 0 <= start < values.size - 1:
        raise ValueError(
            f"start={start} is out of range; it must satisfy 0 <= start <= {values.size - 2} "
            "so that the window holds at least 2 points."
        )
    times, gaps = positions[start:], values[start:] - floor
    usable = np.isfinite(gaps) & (gaps > 0)
    if not usable[0]:
        raise ValueError(
            f"the gap at start={start} is {gaps[0]} (loss minus floor={floor}); it must be "
            "positive and finite."
        )
    if usable.sum() < 2:
        raise ValueError(
            f"only {int(usable.sum())} usable point in the window from start={start} (finite "
            f"and above floor={floor}); at least 2 are needed."
        )
    return times, gaps, usable


def _log_gaps(gaps: np.ndarray) -> np.ndarray:
    """log(gap), with gap <= 0 (converged to the floor) as -inf and NaN or +inf as +inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(np.where(gaps > 0, gaps, 0.0))
    return np.where(np.isnan(gaps) | (gaps == np.inf), np.inf, logs)


def geometric_envelope(
    losses: Sequence[float] | np.ndarray,
    start: int = 0,
    steps: Sequence[float] | np.ndarray | None = None,
    floor: float = 0.0,
    tolerance: float = 0.0,
) -> EnvelopeTest:
    """Test g_t <= g_t0 rho^(t - t0) for all t >= t0, with g_t = L_t - floor.

    rho = (g_T / g_t0)^(1 / (T - t0)) is the envelope through the first point t0 and the last
    point T with a positive, finite gap; in log space the envelope is the chord between them,
    so a curve convex in log (fast then slow) holds and a plateau before a drop fails. A gap
    <= 0 means the loss has reached the floor and satisfies the bound; a NaN or +inf loss
    breaks it.

    Args:
        losses: the loss curve (one value per recorded step).
        start: index of t0 in ``losses``; the window runs to the end of the curve.
        steps: the step of each loss (default 0, 1, 2, ...), strictly increasing.
        floor: L*, the limit of the loss (0 for an interpolating model).
        tolerance: allowed excess of log(g_t) over the log-envelope, >= 0.

    Returns:
        An `EnvelopeTest` with the verdict, rho and the worst point.

    Raises:
        ValueError: for a bad curve, window or tolerance, a non-positive gap at ``start``, or
            fewer than 2 usable points.
    """
    if not tolerance >= 0:
        raise ValueError(f"tolerance={tolerance} is out of range; it must be >= 0.")
    times, gaps, usable = _window_gaps(losses, start, steps, floor)
    last = int(np.flatnonzero(usable)[-1])
    log_gaps = _log_gaps(gaps)
    elapsed = times - times[0]
    log_rate = (log_gaps[last] - log_gaps[0]) / elapsed[last]
    excess = log_gaps - (log_gaps[0] + log_rate * elapsed)
    inner = np.ones(times.size, dtype=bool)
    inner[[0, last]] = False
    if inner.any():
        worst = int(np.flatnonzero(inner)[np.argmax(excess[inner])])
        worst_excess = float(excess[worst])
    else:
        worst, worst_excess = last, -math.inf
    return EnvelopeTest(
        holds=worst_excess <= tolerance + _ROUNDING,
        rate=math.exp(log_rate),
        worst_excess=worst_excess,
        worst_step=float(times[worst]),
        start_step=float(times[0]),
        end_step=float(times[last]),
    )


def smallest_envelope_rate(
    losses: Sequence[float] | np.ndarray,
    start: int = 0,
    steps: Sequence[float] | np.ndarray | None = None,
    floor: float = 0.0,
) -> float:
    """The curve's certified rate: the smallest rho with g_t <= g_t0 rho^(t - t0) for t >= t0.

    rho = max over t > t0 of (g_t / g_t0)^(1 / (t - t0)), with g_t = L_t - floor: the tightest
    geometric bound the curve satisfies from t0. Gaps <= 0 constrain nothing; a NaN or +inf
    loss gives inf (no geometric bound holds).

    Args:
        losses: the loss curve (one value per recorded step).
        start: index of t0 in ``losses``; the window runs to the end of the curve.
        steps: the step of each loss (default 0, 1, 2, ...), strictly increasing.
        floor: L*, the limit of the loss.

    Returns:
        rho; below 1 certifies linear convergence at that rate over the window.

    Raises:
        ValueError: for a bad curve or window, a non-positive gap at ``start``, or fewer than
            2 usable points.
    """
    times, gaps, _ = _window_gaps(losses, start, steps, floor)
    log_gaps = _log_gaps(gaps)
    log_rates = (log_gaps[1:] - log_gaps[0]) / (times[1:] - times[0])
    return math.exp(float(np.max(log_rates)))


def steps_to_reach(
    losses: Sequence[float] | np.ndarray,
    threshold: float,
    steps: Sequence[float] | np.ndarray | None = None,
) -> float:
    """The first step at which the loss is <= ``threshold``, interpolated in log-loss.

    With i the first index where L_i <= threshold: t = t_{i-1} + (t_i - t_{i-1}) *
    (log L_{i-1} - log threshold) / (log L_{i-1} - log L_i), exact for a geometric curve.
    Returns ``steps[0]`` when the curve starts at or below the threshold; ``steps[i]`` when
    L_{i-1} is not finite; interpolates linearly in loss when L_i <= 0 (no logarithm).

    Args:
        losses: the loss curve (one value per recorded step).
        threshold: the loss to reach, > 0.
        steps: the step of each loss (default 0, 1, 2, ...), strictly increasing.

    Returns:
        The (fractional) step, or ``math.inf`` if the curve never reaches the threshold.

    Raises:
        ValueError: for a bad curve or a threshold that is not positive and finite.
    """
    if not 0 < threshold < math.inf:
        raise ValueError(f"threshold={threshold} is out of range; it must be positive and finite.")
    values, positions = curve_arrays(losses, steps)
    reached = np.flatnonzero(values <= threshold)
    if reached.size == 0:
        return math.inf
    index = int(reached[0])
    if index == 0:
        return float(positions[0])
    before, after = float(values[index - 1]), float(values[index])
    if not math.isfinite(before):
        return float(positions[index])
    if after > 0:
        fraction = math.log(before / threshold) / math.log(before / after)
    else:
        fraction = (before - threshold) / (before - after)
    return float(positions[index - 1] + fraction * (positions[index] - positions[index - 1]))


def band_log_slope(
    losses: Sequence[float] | np.ndarray,
    high: float,
    low: float,
    steps: Sequence[float] | np.ndarray | None = None,
) -> BandSlope:
    """The mean slope of log(loss) over the loss band [low, high], for comparing speeds.

    slope = (log(low) - log(high)) / (t_low - t_high), with t_high and t_low the steps at which
    the curve reaches ``high`` and ``low`` (`steps_to_reach`). Curves that start at different
    losses are compared over the same band. NaN when the curve never reaches ``low`` or starts
    below ``high`` (its entry into the band was not recorded).

    Args:
        losses: the loss curve (one value per recorded step).
        high, low: the band's edges, 0 < low < high.
        steps: the step of each loss (default 0, 1, 2, ...), strictly increasing.

    Returns:
        A `BandSlope` with both crossing steps and the slope.

    Raises:
        ValueError: for a bad curve or band.
    """
    if not 0 < low < high < math.inf:
        raise ValueError(
            f"band [low={low}, high={high}] is out of range; it must satisfy 0 < low < high < inf."
        )
    values, _ = curve_arrays(losses, steps)
    high_step = steps_to_reach(values, high, steps)
    low_step = steps_to_reach(values, low, steps)
    entered = values[0] >= high and math.isfinite(low_step)
    slope = (math.log(low) - math.log(high)) / (low_step - high_step) if entered else math.nan
    return BandSlope(high=high, low=low, high_step=high_step, low_step=low_step, slope=slope)
