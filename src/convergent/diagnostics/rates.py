"""Linear (geometric) convergence rates of loss curves, with a confidence interval.

A curve converges linearly at rate rho in (0, 1) when loss_t - floor ~ C rho^t. On a
window of steps we fit log(loss_t - floor) = a + b t by least squares; rho = exp(b), and
the interval is exp of the Student-t interval on the slope b (n - 2 degrees of freedom).
The per-step contraction 1 - rho is the "speed": larger is faster.

R^2 of this fit judges whether log(loss - floor) is a straight line, which a linear
convergence bound does not require: a fast transient followed by slower decay satisfies the
bound yet fits poorly. To test the bound itself, to fit the floor, or to compare speeds over a
common loss band, see `convergence` (`geometric_envelope`, `smallest_envelope_rate`,
`fit_rate_with_floor`, `steps_to_reach`, `band_log_slope`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class RateFit:
    """A fitted linear rate.

    Attributes:
        rate: rho = exp(slope), the per-step factor of the loss gap (< 1 means convergence).
        rate_low, rate_high: the confidence interval of rho.
        slope: the fitted slope of log(loss - floor) per step.
        slope_stderr: its standard error.
        intercept: the fitted log(loss - floor) at step 0.
        r_squared: coefficient of determination of the log-linear fit.
        start, stop: the window of steps used (stop exclusive).
        points: how many points entered the fit.
        confidence: the interval's confidence level.
    """

    rate: float
    rate_low: float
    rate_high: float
    slope: float
    slope_stderr: float
    intercept: float
    r_squared: float
    start: int
    stop: int
    points: int
    confidence: float

    @property
    def contraction(self) -> float:
        """1 - rho: the fraction of the loss gap removed per step."""
        return 1.0 - self.rate

    @property
    def steps_to_halve(self) -> float:
        """log(1/2) / log(rho): steps for the gap to halve (inf when not converging)."""
        return math.log(0.5) / self.slope if self.slope < 0 else math.inf


def fit_linear_rate(
    losses: Sequence[float] | np.ndarray,
    start: int = 0,
    stop: int | None = None,
    steps: Sequence[float] | np.ndarray | None = None,
    floor: float = 0.0,
    confidence: float = 0.95,
) -> RateFit:
    """Fit loss_t - floor = C rho^t over ``losses[start:stop]`` by log-linear regression.

    Args:
        losses: the loss curve (one value per recorded step).
        start, stop: the window, as indices into ``losses`` (``stop`` exclusive; default end).
        steps: the step of each loss (default 0, 1, 2, ...), for curves logged every k steps.
        floor: the limit the loss converges to (0 for an interpolating model); points at or
            below it are dropped.
        confidence: level of the interval, in (0, 1).

    Raises:
        ValueError: for a bad window or confidence, or fewer than three usable points.
    """
    values = np.asarray(losses, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"losses must be one curve (1-D), got shape {values.shape}.")
    stop = len(values) if stop is None else stop
    if not 0 <= start < stop <= len(values):
        raise ValueError(
            f"window [{start}, {stop}) is out of range; it must satisfy 0 <= start < stop <= "
            f"{len(values)}."
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} is out of range; allowed range is (0, 1).")
    positions = (
        np.arange(len(values), dtype=np.float64)
        if steps is None
        else np.asarray(steps, dtype=np.float64)
    )
    if positions.shape != values.shape:
        raise ValueError(f"steps has {positions.size} values; expected {values.size}.")
    window_x, window_y = positions[start:stop], values[start:stop] - floor
    usable = np.isfinite(window_y) & (window_y > 0)
    x, y = window_x[usable], np.log(window_y[usable])
    if x.size < 3:
        raise ValueError(
            f"only {x.size} usable points in the window [{start}, {stop}) (finite and above "
            f"floor={floor}); at least 3 are needed."
        )
    result = stats.linregress(x, y)
    slope, stderr = float(result.slope), float(result.stderr)
    half_width = float(stats.t.ppf(0.5 + confidence / 2, x.size - 2)) * stderr
    return RateFit(
        rate=math.exp(slope),
        rate_low=math.exp(slope - half_width),
        rate_high=math.exp(slope + half_width),
        slope=slope,
        slope_stderr=stderr,
        intercept=float(result.intercept),
        r_squared=float(result.rvalue) ** 2,
        start=start,
        stop=stop,
        points=int(x.size),
        confidence=confidence,
    )
