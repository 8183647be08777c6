"""Known-answer tests of the convergence-bound tools on synthetic curves.

Every expected value is written here from the curve's formula (or numpy), not from the
functions under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from convergent.diagnostics import (
    band_log_slope,
    fit_linear_rate,
    fit_rate_with_floor,
    geometric_envelope,
    smallest_envelope_rate,
    steps_to_reach,
)

DECAY = -math.log(0.9)
DECAY_95 = -math.log(0.95)


def plateau_curve() -> np.ndarray:
    """0.9^t for 20 steps, flat at 0.9^19 for 30 steps, then 0.9 per step for 30 steps."""
    return 0.9 ** np.concatenate([np.arange(20), np.full(30, 19), 19 + np.arange(1, 31)])


def test_exact_geometric_curve_holds_at_its_rate():
    curve = 2.0 * 0.9 ** np.arange(50)
    test = geometric_envelope(curve)
    assert test.holds
    assert test.rate == pytest.approx(0.9, rel=1e-12)
    assert test.worst_excess == pytest.approx(0.0, abs=1e-12)
    assert (test.start_step, test.end_step) == (0.0, 49.0)
    assert smallest_envelope_rate(curve) == pytest.approx(0.9, rel=1e-12)


def test_floor_fit_recovers_an_exact_geometric_curve_above_a_floor():
    fit = fit_rate_with_floor(0.3 + 2.0 * 0.9 ** np.arange(50))
    assert fit.decay == pytest.approx(DECAY, rel=1e-8)
    assert fit.floor == pytest.approx(0.3, abs=1e-9)
    assert fit.amplitude == pytest.approx(2.0, rel=1e-8)
    assert fit.rate == pytest.approx(0.9, rel=1e-8)
    assert fit.r_squared == pytest.approx(1.0)
    # Exact data: the interval is a few ulps wide; it covers k up to the solver's tolerance.
    assert fit.decay_low - 1e-9 <= DECAY <= fit.decay_high + 1e-9
    assert (fit.start, fit.stop, fit.points, fit.confidence) == (0, 50, 50, 0.95)


def test_floor_fit_window_and_steps():
    steps = np.arange(0, 300, 5)
    losses = 0.1 + 0.97**steps
    fit = fit_rate_with_floor(losses, start=2, stop=40, steps=steps)
    assert fit.rate == pytest.approx(0.97, rel=1e-7)
    assert fit.floor == pytest.approx(0.1, abs=1e-8)
    # t0 = steps[2] = 10: the amplitude is the gap there.
    assert fit.amplitude == pytest.approx(0.97**10, rel=1e-7)
    assert (fit.start, fit.stop, fit.points) == (2, 40, 38)


def test_floor_fit_interval_covers_the_true_decay_under_noise():
    generator = np.random.default_rng(0)
    steps = np.arange(60)
    trials, covered = 200, 0
    for _ in range(trials):
        losses = 0.3 + 2.0 * 0.9**steps + generator.normal(0.0, 0.01, size=steps.size)
        fit = fit_rate_with_floor(losses, floor_below_minimum=False)
        covered += fit.decay_low <= DECAY <= fit.decay_high
    # A 95 % interval covers 190 of 200 (binomial sd 3.1); a 70 % one (140) fails the band.
    assert 176 <= covered <= 200


def test_floor_fit_interval_width_and_r_squared_follow_their_formulas():
    generator = np.random.default_rng(2)
    steps = np.arange(8)
    losses = 0.3 + 2.0 * 0.7**steps + generator.normal(0.0, 0.01, size=steps.size)
    fit = fit_rate_with_floor(losses, confidence=0.9, floor_below_minimum=False)
    # Student t with n - 3 = 5 degrees of freedom (three fitted parameters).
    half_width = stats.t.ppf(0.95, 5) * fit.decay_stderr
    assert fit.decay_high - fit.decay == pytest.approx(half_width, rel=1e-9)
    assert fit.decay - fit.decay_low == pytest.approx(half_width, rel=1e-9)
    residuals = losses - (fit.floor + fit.amplitude * np.exp(-fit.decay * steps))
    r_squared = 1 - residuals @ residuals / np.sum((losses - losses.mean()) ** 2)
    assert fit.r_squared == pytest.approx(r_squared, rel=1e-12)
    assert fit.r_squared < 1 - 1e-6


def test_floor_bound_binds_on_a_noisy_curve_at_its_floor():
    generator = np.random.default_rng(1)
    losses = 0.3 + 2.0 * 0.9 ** np.arange(60) + generator.normal(0.0, 0.01, size=60)
    # The noisy minimum lies below the true floor 0.3, so the optional bound is active there.
    assert losses.min() < 0.3
    bounded = fit_rate_with_floor(losses, floor_below_minimum=True)
    assert bounded.floor == pytest.approx(losses.min())
    assert fit_rate_with_floor(losses).floor > losses.min()  # unbounded by default


def test_fast_then_slow_holds_though_its_log_linear_fit_is_poor():
    steps = np.arange(60)
    losses = 0.5**steps + 0.98**steps
    test = geometric_envelope(losses)
    assert test.holds
    assert test.worst_excess < 0
    # log of a sum of exponentials is convex, so the chord from 0 to T is the tightest bound.
    chord = (losses[-1] / losses[0]) ** (1 / 59)
    assert test.rate == pytest.approx(chord, rel=1e-12)
    assert smallest_envelope_rate(losses) == pytest.approx(chord, rel=1e-12)
    slope, intercept = np.polyfit(steps, np.log(losses), 1)
    residuals = np.log(losses) - (intercept + slope * steps)
    r_squared = 1 - residuals @ residuals / np.sum((np.log(losses) - np.log(losses).mean()) ** 2)
    assert r_squared < 0.99
    assert fit_linear_rate(losses).r_squared == pytest.approx(r_squared, rel=1e-9)


def test_plateau_breaks_the_envelope():
    losses = plateau_curve()
    test = geometric_envelope(losses)
    # Chord in log space from (0, 0) to (79, 49 log 0.9); the excess log(0.9) (d_t - 49 t / 79)
    # is largest at the plateau's last step, t = 49, where d_t = 19.
    assert not test.holds
    assert test.rate == pytest.approx(0.9 ** (49 / 79), rel=1e-12)
    assert test.worst_step == 49.0
    excess = DECAY * (49 * 49 / 79 - 19)
    assert test.worst_excess == pytest.approx(excess, rel=1e-12)
    assert test.worst_excess > 0
    # The tightest bound is set by the plateau's end: min over t of d_t / t is 19 / 49.
    assert smallest_envelope_rate(losses) == pytest.approx(0.9 ** (19 / 49), rel=1e-12)
    # A tolerance above the excess accepts it.
    assert geometric_envelope(losses, tolerance=excess + 1e-6).holds
    assert not geometric_envelope(losses, tolerance=excess - 1e-6).holds
    # From the plateau's last step on, the curve is geometric again.
    assert geometric_envelope(losses, start=49).rate == pytest.approx(0.9, rel=1e-12)


def test_the_floor_decides_the_envelope_rate():
    steps = np.arange(60)
    losses = 0.5 + 0.9**steps
    with_floor = geometric_envelope(losses, floor=0.5)
    assert with_floor.holds
    assert with_floor.rate == pytest.approx(0.9, rel=1e-9)
    # Without the floor, log(0.5 + 0.9^t) is still convex (the bound holds), but the chord
    # rate is set by the floor, not by 0.9.
    without_floor = geometric_envelope(losses)
    assert without_floor.holds
    assert without_floor.rate == pytest.approx(((0.5 + 0.9**59) / 1.5) ** (1 / 59), rel=1e-12)
    assert without_floor.rate > 0.98


def test_envelope_with_steps_and_a_start():
    steps = np.arange(0, 500, 10)
    losses = np.concatenate([[5.0, 5.0], 3.0 * 0.99 ** steps[2:]])
    test = geometric_envelope(losses, start=2, steps=steps)
    assert test.holds
    assert test.rate == pytest.approx(0.99, rel=1e-12)
    assert (test.start_step, test.end_step) == (20.0, 490.0)
    assert not geometric_envelope(losses, steps=steps).holds  # the flat start breaks it


def test_envelope_treats_a_reached_floor_as_satisfied_and_nan_as_broken():
    converged = np.concatenate([0.8 ** np.arange(20), np.zeros(10)])
    test = geometric_envelope(converged)
    assert test.holds
    assert test.rate == pytest.approx(0.8, rel=1e-12)
    assert test.end_step == 19.0
    assert smallest_envelope_rate(converged) == pytest.approx(0.8, rel=1e-12)
    diverged = np.concatenate([0.8 ** np.arange(20), [np.nan]])
    test = geometric_envelope(diverged)
    assert not test.holds
    assert (test.worst_excess, test.worst_step) == (math.inf, 20.0)
    assert smallest_envelope_rate(diverged) == math.inf


def test_steps_to_reach_interpolates_in_log_loss():
    losses = 2.0 * 0.9 ** np.arange(50)
    # 2 * 0.9^t = 1 at t = log(1/2) / log(0.9) = 6.58..., between recorded steps 6 and 7.
    assert steps_to_reach(losses, 1.0) == pytest.approx(math.log(0.5) / math.log(0.9), rel=1e-12)
    assert steps_to_reach(losses, 1e-6) == math.inf
    assert steps_to_reach(losses, 3.0) == 0.0
    assert steps_to_reach(losses, losses[10]) == pytest.approx(10.0, rel=1e-12)
    # A loss of 0 has no logarithm: that segment is interpolated linearly in loss.
    assert steps_to_reach([1.0, 0.0], 0.25) == pytest.approx(0.75)
    # After a NaN there is nothing to interpolate from: the recorded step is returned.
    assert steps_to_reach([np.nan, 0.5], 1.0) == 1.0
    logged = np.arange(0, 500, 10)
    crossing = math.log(0.5) / math.log(0.99)  # 68.97: between logged steps 60 and 70
    assert steps_to_reach(2.0 * 0.99**logged, 1.0, steps=logged) == pytest.approx(
        crossing, rel=1e-12
    )


def test_band_slope_of_a_geometric_curve_is_its_log_rate():
    curve = 2.0 * 0.9 ** np.arange(80)
    for high, low in [(1.0, 0.1), (1.5, 0.01), (0.3, 0.29)]:
        band = band_log_slope(curve, high=high, low=low)
        assert band.slope == pytest.approx(math.log(0.9), rel=1e-10)
        assert band.rate == pytest.approx(0.9, rel=1e-10)
        assert band.high_step == pytest.approx(math.log(high / 2) / math.log(0.9), rel=1e-10)
        assert band.low_step == pytest.approx(math.log(low / 2) / math.log(0.9), rel=1e-10)
    logged = np.arange(0, 1000, 10)
    band = band_log_slope(3.0 * 0.99**logged, high=1.0, low=0.1, steps=logged)
    assert band.slope == pytest.approx(math.log(0.99), rel=1e-10)


def test_band_slope_compares_curves_that_start_at_different_losses():
    steps = np.arange(100)
    low_start, high_start = 2.0 * 0.95**steps, 5.0 * 0.95**steps
    a, b = band_log_slope(low_start, 1.0, 0.1), band_log_slope(high_start, 1.0, 0.1)
    assert a.slope == pytest.approx(b.slope, rel=1e-10)
    assert a.slope == pytest.approx(math.log(0.95), rel=1e-10)
    assert b.high_step - a.high_step == pytest.approx(math.log(5 / 2) / DECAY_95, rel=1e-10)
    # A faster curve has the steeper band slope, whatever its start.
    faster = band_log_slope(5.0 * 0.9**steps, 1.0, 0.1)
    assert faster.slope == pytest.approx(math.log(0.9), rel=1e-10)


def test_band_slope_is_nan_when_the_band_is_not_crossed():
    curve = 2.0 * 0.9 ** np.arange(20)  # ends at 2 * 0.9^19 = 0.27
    never_low = band_log_slope(curve, high=1.0, low=0.1)
    assert math.isnan(never_low.slope)
    assert never_low.low_step == math.inf
    starts_inside = band_log_slope(curve, high=3.0, low=0.5)
    assert math.isnan(starts_inside.slope)
    assert starts_inside.high_step == 0.0


def test_errors_name_the_bad_value():
    curve = 2.0 * 0.9 ** np.arange(10)
    with pytest.raises(ValueError, match=r"start=9 is out of range"):
        geometric_envelope(curve, start=9)
    with pytest.raises(ValueError, match=r"start=-1 is out of range"):
        smallest_envelope_rate(curve, start=-1)
    with pytest.raises(ValueError, match=r"only 1 usable point"):
        geometric_envelope([1.0, 0.0, -1.0])
    with pytest.raises(ValueError, match=r"gap at start=0 is 0.0"):
        geometric_envelope([1.0, 0.5], floor=1.0)
    with pytest.raises(ValueError, match=r"tolerance=-0.1 is out of range"):
        geometric_envelope(curve, tolerance=-0.1)
    with pytest.raises(ValueError, match=r"window \[5, 3\) is out of range"):
        fit_rate_with_floor(curve, start=5, stop=3)
    with pytest.raises(ValueError, match=r"only 3 finite points"):
        fit_rate_with_floor([1.0, 0.5, np.nan, 0.3])
    with pytest.raises(ValueError, match=r"confidence=1.5 is out of range"):
        fit_rate_with_floor(curve, confidence=1.5)
    with pytest.raises(ValueError, match=r"constant at 1.0"):
        fit_rate_with_floor([1.0] * 6)
    with pytest.raises(ValueError, match=r"threshold=0 is out of range"):
        steps_to_reach(curve, 0)
    with pytest.raises(ValueError, match=r"band \[low=1.0, high=1.0\] is out of range"):
        band_log_slope(curve, high=1.0, low=1.0)
    with pytest.raises(ValueError, match=r"band \[low=-0.1, high=1.0\] is out of range"):
        band_log_slope(curve, high=1.0, low=-0.1)
    with pytest.raises(ValueError, match=r"steps must be finite and strictly increasing"):
        steps_to_reach(curve, 1.0, steps=[0, 1, 1, 2, 3, 4, 5, 6, 7, 8])
    with pytest.raises(ValueError, match=r"steps has shape \(3,\); expected \(10,\)"):
        geometric_envelope(curve, steps=[0, 1, 2])
    two_curves = np.ones((2, 10))
    for tool in (geometric_envelope, smallest_envelope_rate, fit_rate_with_floor):
        with pytest.raises(ValueError, match=r"got shape \(2, 10\)"):
            tool(two_curves)
    with pytest.raises(ValueError, match=r"got shape \(2, 10\)"):
        steps_to_reach(two_curves, 0.5)
    with pytest.raises(ValueError, match=r"got shape \(2, 10\)"):
        band_log_slope(two_curves, 1.0, 0.5)
