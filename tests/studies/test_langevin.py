"""What the langevin study measures in its runs: the gap's trend, the gradient RMS and the
noise / drift ratio of a Langevin step (reported in the tables, not a check)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from convergent.optim import Langevin
from convergent.studies.langevin import gradient_rms
from convergent.studies.langevin.measures import (
    gap_trend,
    mean_noise_ratio,
    noise_to_drift_ratio,
    trend,
)


def test_trend_is_the_least_squares_change_over_the_span():
    line = [{"step": step, "x": 1.0 + step / 100} for step in range(0, 101, 10)]
    assert trend(line, "x") == pytest.approx(1.0)
    plateau = [{"step": step, "x": 3.0} for step in range(0, 101, 10)]
    assert trend(plateau, "x") == 0.0
    zigzag = [
        {"step": step, "x": step / 100 + (0.3 if step % 20 else -0.3)} for step in range(0, 101, 10)
    ]
    assert trend(zigzag, "x") == pytest.approx(1.0, abs=0.15)  # the noise averages out
    assert math.isnan(trend(line[:1], "x"))
    # the gap's trend against numpy's least squares, on an uneven record spacing
    steps = [0, 10, 30, 60, 100, 150]
    gaps = [0.1, 0.12, 0.11, 0.15, 0.14, 0.2]
    record = {"trace": [{"step": s, "gap": g} for s, g in zip(steps, gaps, strict=True)]}
    slope = np.polyfit(steps, gaps, 1)[0]
    assert gap_trend(record) == pytest.approx(slope * 150, rel=1e-12)


def test_gradient_rms_of_known_gradients():
    ones = torch.zeros(4, requires_grad=True)
    zeros = torch.zeros(3, 4, requires_grad=True)
    untouched = torch.zeros(5, requires_grad=True)  # no gradient: not counted
    ones.grad, zeros.grad = torch.full((4,), 3.0), torch.zeros(3, 4)
    # sqrt((4 * 9 + 12 * 0) / 16)
    assert gradient_rms([ones, zeros, untouched]) == pytest.approx(1.5)
    assert gradient_rms([untouched]) == 0.0


def test_noise_to_drift_ratio_matches_one_langevin_step():
    lr, s, entries = 0.01, 0.004, 200_000
    gradient = torch.randn(entries, generator=torch.Generator().manual_seed(1)) * 0.3

    def moved(noise: float) -> torch.Tensor:
        weight = torch.zeros(entries, requires_grad=True)
        weight.grad = gradient.clone()
        Langevin([weight], lr=lr, s=noise, seed=0).step()
        return weight.detach()

    drift = moved(0.0)
    noise = moved(s) - drift
    measured = float(noise.pow(2).mean().sqrt() / drift.pow(2).mean().sqrt())
    rms = float(gradient.pow(2).mean().sqrt())
    assert noise_to_drift_ratio(lr, s, rms) == pytest.approx(measured, rel=0.01)
    assert noise_to_drift_ratio(0.01, 0.0025, 0.5) == pytest.approx(1.0)  # 0.005 / 0.005
    assert noise_to_drift_ratio(0.01, 0.0025, 0.0) == math.inf
    with pytest.raises(ValueError, match="lr > 0"):
        noise_to_drift_ratio(0.0, 0.0025, 0.5)


def test_mean_noise_ratio_averages_the_records_after_step_zero():
    lr, s = 0.01, 0.0025  # sqrt(lr s) / lr = 0.5
    trace: list[dict[str, Any]] = [
        {"step": 0, "grad_rms": None},
        {"step": 10, "grad_rms": 1.0},
        {"step": 20, "grad_rms": 0.5},
    ]
    assert mean_noise_ratio(trace, lr, s) == pytest.approx((0.5 + 1.0) / 2)
    assert math.isnan(mean_noise_ratio([{"step": 0}, {"step": 10}], lr, s))  # not stored
