"""The Langevin theory helpers against simulations and closed forms written here.

calibrated_s: the posterior variance of a 1-D linear regression; radial_relaxation_time and
diffusion_radius: simulated chains of the discretized SDE (plain torch, not our optimizer);
fit_saturation: synthetic saturating curves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from convergent.diagnostics import fit_rate_with_floor, fit_saturation
from convergent.optim import Langevin, calibrated_s, implied_noise_variance
from convergent.regularize import (
    diffusion_radius,
    lam_for_stationary_radius,
    radial_relaxation_time,
    stationary_radius,
)


def test_calibrated_s_samples_the_bayesian_posterior_of_a_linear_regression():
    # y = w x + noise, V(w) = mean (y - w x)^2 over N examples. With a flat prior the posterior
    # of w is Gaussian with variance sigma^2 / sum x^2.
    generator = torch.Generator().manual_seed(0)
    examples, sigma2 = 50, 0.25
    x = torch.randn(examples, generator=generator, dtype=torch.float64)
    y = 1.5 * x + math.sqrt(sigma2) * torch.randn(
        examples, generator=generator, dtype=torch.float64
    )
    posterior_variance = sigma2 / float((x**2).sum())
    # 400 independent chains in one parameter: the loss is a sum of one V per chain.
    chains = 400
    w = torch.zeros(chains, dtype=torch.float64, requires_grad=True)
    optimizer = Langevin([w], lr=0.02, s=calibrated_s(sigma2, examples), seed=1)
    samples = []
    for step in range(1_500):
        optimizer.zero_grad()
        ((y[:, None] - w[None, :] * x[:, None]) ** 2).mean(dim=0).sum().backward()
        optimizer.step()
        if step >= 500 and step % 25 == 0:
            samples.append(w.detach().clone())
    samples = torch.stack(samples).flatten().numpy()
    # Small-step bias of the Euler scheme: lr * curvature = 0.02 * 2 * mean x^2 ~ 4 %.
    assert np.var(samples) == pytest.approx(posterior_variance, rel=0.12)
    assert implied_noise_variance(calibrated_s(sigma2, examples, 7), examples, 7) == pytest.approx(
        sigma2
    )
    # The study's first temperature, 2 / N for 900 examples of 256 outputs at MSE 0.065, is
    # about 2,000 times the calibrated one.
    assert (2 / 900) / calibrated_s(0.065, 900, 256) == pytest.approx(256 / (2 * 0.065))
    with pytest.raises(ValueError, match="noise_variance=0"):
        calibrated_s(0, 10)


def _simulate_radius(kind, lam, numel, s, lr, start, steps, chains=2000, eps=1.0):
    """Mean ||W|| of ``chains`` Euler-Maruyama chains of dW = -grad(lam g(|W|^2)) dt + sqrt(s) dB."""
    generator = torch.Generator().manual_seed(3)
    w = torch.randn(chains, numel, generator=generator, dtype=torch.float64)
    w = start * w / w.norm(dim=1, keepdim=True)
    means = []
    for _ in range(steps):
        squared = (w**2).sum(dim=1, keepdim=True)
        if kind == "log":
            slope = torch.log1p(squared) + squared / (1 + squared)
        else:
            slope = (1 + eps / 2) * squared ** (eps / 2)
        noise = torch.randn(w.shape, generator=generator, dtype=torch.float64)
        w = w - lr * lam * slope * 2 * w + math.sqrt(lr * s) * noise
        means.append(float(w.norm(dim=1).mean()))
    return np.array(means)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_radial_relaxation_time_matches_simulated_chains(kind):
    numel, s, lr = 32, 0.01, 0.01
    lam = lam_for_stationary_radius(kind, 1.0, numel, s)
    tau = radial_relaxation_time(kind, lam, numel, s)
    steps = int(6 * tau / lr)
    means = _simulate_radius(kind, lam, numel, s, lr, start=1.15, steps=steps)
    # Fit mean radius = limit + C exp(-k t) and compare 1 / k with tau (in time units).
    fit = fit_rate_with_floor(means, steps=lr * np.arange(1, steps + 1))
    assert 1 / fit.decay == pytest.approx(tau, rel=0.15)
    assert fit.floor == pytest.approx(stationary_radius(kind, lam, numel, s), rel=0.05)
    with pytest.raises(ValueError, match="lam and s must be > 0"):
        radial_relaxation_time(kind, 0.0, numel, s)


def test_diffusion_radius_is_the_rms_norm_of_pure_noise():
    generator = torch.Generator().manual_seed(5)
    chains, numel, s, lr, steps = 4000, 20, 0.5, 0.01, 300
    w = torch.full((chains, numel), 0.3, dtype=torch.float64)
    start = float(w[0].norm())
    for _ in range(steps):
        w = w + math.sqrt(lr * s) * torch.randn(w.shape, generator=generator, dtype=torch.float64)
    rms = float((w**2).sum(dim=1).mean().sqrt())
    assert diffusion_radius(start, numel, s, lr * steps) == pytest.approx(rms, rel=0.02)
    assert diffusion_radius(2.0, 5, 0.0, 10.0) == 2.0
    with pytest.raises(ValueError, match="time=-1"):
        diffusion_radius(1.0, 5, 0.1, -1)


def test_fit_saturation_finds_the_asymptote_with_an_interval():
    t = np.arange(200)
    exact = fit_saturation(3.0 - 2.0 * np.exp(-0.03 * t))
    assert exact.floor == pytest.approx(3.0, rel=1e-8)
    assert exact.amplitude == pytest.approx(2.0, rel=1e-6)
    assert exact.decay == pytest.approx(0.03, rel=1e-6)
    assert (exact.floor_low, exact.floor_high) == pytest.approx((3.0, 3.0), rel=1e-6)
    rng = np.random.default_rng(0)
    covered, trials = 0, 200
    for _ in range(trials):
        noisy = 3.0 - 2.0 * np.exp(-0.03 * t) + rng.normal(0, 0.02, t.size)
        fit = fit_saturation(noisy)
        assert fit.floor_low < fit.floor < fit.floor_high
        assert fit.floor - fit.floor_low == pytest.approx(fit.floor_high - fit.floor)
        covered += fit.floor_low <= 3.0 <= fit.floor_high
    assert 0.9 <= covered / trials <= 0.99
