"""Is a loss curve converging linearly? Bound form, fitted rate, and speed over a band.

Linear convergence theorems (e.g. gradient descent on a one-layer Transformer with residual
connections) are bounds, L_t - L* <= rho^t (L_0 - L*), not a claim that log(L_t - L*) is a
straight line. Each tool here answers one question about a curve (a 1-D array or sequence,
optionally with ``steps`` for curves logged every k steps):

* Does the curve satisfy the bound? `geometric_envelope` tests the gap against the geometric
  envelope through the window's first and last points; `smallest_envelope_rate` gives the
  tightest rho the curve satisfies (its certified rate). A fast transient followed by slow
  decay passes; a plateau followed by a drop fails.
* What rate does it decay at, when the floor L* is unknown? `fit_rate_with_floor` fits
  L* + C exp(-k t) by nonlinear least squares. (`fit_linear_rate` in `rates` fits
  log(L_t - floor) linearly for a known floor; its R^2 judges straightness, not the bound.)
* Where does a rising curve level off (a norm under a regularizer)? `fit_saturation` fits
  A - C exp(-k t), with an interval on the asymptote A.
* Which of several curves is faster? `steps_to_reach` and `band_log_slope` compare curves
  that start at different losses over a common loss band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

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
class FloorFit:
    """A nonlinear least-squares fit of L_t = floor + amplitude * exp(-decay * (t - t0)).

    Attributes:
        decay: k, the fitted exponent per step (> 0).
        decay_low, decay_high: its confidence interval, k -+ t_{n-3} * stderr.
        decay_stderr: the standard error of k from the fit's covariance.
        floor: L*, the fitted limit of the loss (at most the window's minimum on request).
        floor_low, floor_high: its confidence interval, L* -+ t_{n-3} * stderr.
        amplitude: C, the fitted gap L_t0 - L* at the window's first step t0.
        rate: exp(-k), the per-step factor of the gap.
        r_squared: coefficient of determination on the loss scale.
        start, stop: the window, as indices into the curve (stop exclusive).
        points: how many finite points entered the fit.
        confidence: the interval's confidence level.
    """

    decay: float
    decay_low: float
    decay_high: float
    decay_stderr: float
    floor: float
    amplitude: float
    rate: float
    r_squared: float
    start: int
    stop: int
    points: int
    confidence: float
    floor_low: float = math.nan
    floor_high: float = math.nan


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


def _curve(
    losses: Sequence[float] | np.ndarray, steps: Sequence[float] | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a curve and its steps; return both as float64 arrays."""
    values = np.asarray(losses, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"losses must be one non-empty curve (1-D), got shape {values.shape}.")
    if steps is None:
        return values, np.arange(values.size, dtype=np.float64)
    positions = np.asarray(steps, dtype=np.float64)
    if positions.shape != values.shape:
        raise ValueError(f"steps has shape {positions.shape}; expected {values.shape}.")
    if not np.all(np.isfinite(positions)) or np.any(np.diff(positions) <= 0):
        raise ValueError("steps must be finite and strictly increasing.")
    return values, positions


def _window_gaps(
    losses: Sequence[float] | np.ndarray,
    start: int,
    steps: Sequence[float] | np.ndarray | None,
    floor: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window's steps, gaps L_t - floor and usable mask; validates the window."""
    values, positions = _curve(losses, steps)
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


def _exponential_decay(
    elapsed: np.ndarray, floor: float, amplitude: float, decay: float
) -> np.ndarray:
    return floor + amplitude * np.exp(-decay * elapsed)


def fit_rate_with_floor(
    losses: Sequence[float] | np.ndarray,
    start: int = 0,
    stop: int | None = None,
    steps: Sequence[float] | np.ndarray | None = None,
    confidence: float = 0.95,
    floor_below_minimum: bool = False,
) -> FloorFit:
    """Fit L_t = L* + C exp(-k (t - t0)) over ``losses[start:stop]`` by nonlinear least squares.

    Bounds keep C > 0, k > 0 and, on request, L* <= min of the window; t0 is the window's
    first step, so C is the gap there. The interval on k is k -+ t_{n-3} * se(k) from the
    fit's covariance (unweighted: it assumes noise of constant size on the loss scale).

    Args:
        losses: the loss curve (one value per recorded step).
        start, stop: the window, as indices into ``losses`` (``stop`` exclusive; default end).
        steps: the step of each loss (default 0, 1, 2, ...), strictly increasing.
        confidence: level of the interval on k, in (0, 1).
        floor_below_minimum: bound L* by the window's minimum. Off by default: on a noisy
            curve that reaches its floor inside the window the minimum lies below L*, the
            bound binds and biases k (its 95 % interval then covered the true k in about a
            third of simulated curves, against 94 % unbounded).

    Returns:
        A `FloorFit` with k, its interval, L*, C, exp(-k) and R^2 on the loss scale.

    Raises:
        ValueError: for a bad curve, window or confidence, fewer than 4 finite points, a
            constant window, or a fit that fails to converge.
    """
    values, positions = _curve(losses, steps)
    stop = values.size if stop is None else stop
    if not 0 <= start < stop <= values.size:
        raise ValueError(
            f"window [{start}, {stop}) is out of range; it must satisfy 0 <= start < stop <= "
            f"{values.size}."
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} is out of range; allowed range is (0, 1).")
    finite = np.isfinite(values[start:stop])
    times, y = positions[start:stop][finite], values[start:stop][finite]
    if y.size < 4:
        raise ValueError(
            f"only {y.size} finite points in the window [{start}, {stop}); at least 4 are "
            "needed to fit a floor, an amplitude and a decay."
        )
    lowest, spread = float(y.min()), float(np.ptp(y))
    if spread == 0:
        raise ValueError(f"the window [{start}, {stop}) is constant at {lowest}; nothing decays.")
    elapsed = times - times[0]
    # Initial guess: a floor a little under the minimum, then a log-linear fit of the gap.
    floor_guess = lowest - 0.05 * spread
    guess_fit = stats.linregress(elapsed, np.log(y - floor_guess))
    decay_guess = -guess_fit.slope if guess_fit.slope < 0 else 1.0 / elapsed[-1]
    initial = (floor_guess, y[0] - floor_guess, decay_guess)
    floor_limit = lowest if floor_below_minimum else np.inf
    try:
        parameters, covariance = optimize.curve_fit(
            _exponential_decay,
            elapsed,
            y,
            p0=initial,
            bounds=([-np.inf, 0.0, 0.0], [floor_limit, np.inf, np.inf]),
            max_nfev=10_000,
        )
    except (RuntimeError, ValueError) as error:
        raise ValueError(
            f"the fit of L* + C exp(-k t) on the window [{start}, {stop}) did not converge: {error}"
        ) from error
    floor, amplitude, decay = (float(value) for value in parameters)
    stderr = math.sqrt(covariance[2, 2]) if np.isfinite(covariance[2, 2]) else math.inf
    if not math.isfinite(stderr):
        raise ValueError(
            f"the fit on the window [{start}, {stop}) did not converge to a determined decay "
            "(its covariance is infinite)."
        )
    quantile = float(stats.t.ppf(0.5 + confidence / 2, y.size - 3))
    half_width = quantile * stderr
    floor_half_width = quantile * math.sqrt(covariance[0, 0]) if covariance[0, 0] >= 0 else math.inf
    residuals = y - _exponential_decay(elapsed, floor, amplitude, decay)
    return FloorFit(
        decay=decay,
        decay_low=decay - half_width,
        decay_high=decay + half_width,
        decay_stderr=stderr,
        floor=floor,
        amplitude=amplitude,
        rate=math.exp(-decay),
        r_squared=1.0 - float(residuals @ residuals) / float(np.sum((y - y.mean()) ** 2)),
        start=start,
        stop=stop,
        points=int(y.size),
        confidence=confidence,
        floor_low=floor - floor_half_width,
        floor_high=floor + floor_half_width,
    )


def fit_saturation(
    values: Sequence[float] | np.ndarray,
    start: int = 0,
    stop: int | None = None,
    steps: Sequence[float] | np.ndarray | None = None,
    confidence: float = 0.95,
) -> FloorFit:
    """Fit a rising curve that levels off, v_t = A - C exp(-k (t - t0)), C > 0.

    For a norm under a confining regularizer: is it bounded, and where does it level off? The
    fit is `fit_rate_with_floor` on -v, so ``floor`` (with ``floor_low``, ``floor_high``) is
    the asymptote A, ``amplitude`` is C = A - v_t0, and 1 / ``decay`` the relaxation time in
    steps.

    Args:
        values: the curve (one value per recorded step).
        start, stop: the window, as indices into ``values`` (``stop`` exclusive; default end).
        steps: the step of each value (default 0, 1, 2, ...), strictly increasing.
        confidence: level of the intervals, in (0, 1).

    Returns:
        A `FloorFit` whose floor is the asymptote A.

    Raises:
        ValueError: as `fit_rate_with_floor`.
    """
    flipped = fit_rate_with_floor(
        -np.asarray(values, dtype=np.float64), start, stop, steps, confidence
    )
    return FloorFit(
        decay=flipped.decay,
        decay_low=flipped.decay_low,
        decay_high=flipped.decay_high,
        decay_stderr=flipped.decay_stderr,
        floor=-flipped.floor,
        amplitude=flipped.amplitude,
        rate=flipped.rate,
        r_squared=flipped.r_squared,
        start=flipped.start,
        stop=flipped.stop,
        points=flipped.points,
        confidence=flipped.confidence,
        floor_low=-flipped.floor_high,
        floor_high=-flipped.floor_low,
    )


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
    values, positions = _curve(losses, steps)
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
    values, _ = _curve(losses, steps)
    high_step = steps_to_reach(values, high, steps)
    low_step = steps_to_reach(values, low, steps)
    entered = values[0] >= high and math.isfinite(low_step)
    slope = (math.log(low) - math.log(high)) / (low_step - high_step) if entered else math.nan
    return BandSlope(high=high, low=low, high_step=high_step, low_step=low_step, slope=slope)
