"""Known answer: Langevin with s = 2 samples exp(-V) for V = 1/2 (x - m)^T P (x - m), N(m, P^-1).

Many chains run as the rows of one [chains, 2] parameter, so one optimizer step advances all.
Euler-Maruyama with step h has a stationary covariance of its own, Sigma_h, the solution of
Sigma_h = (I - hP) Sigma_h (I - hP)^T + 2h I, which tends to P^-1 as h -> 0: the test checks the
moments against Sigma_h tightly and against P^-1 within the O(h) bias.
"""

from __future__ import annotations

import torch
from scipy.linalg import solve_discrete_lyapunov

from convergent.optim.langevin import Langevin

PRECISION = torch.tensor([[2.0, 1.2], [1.2, 1.5]], dtype=torch.float64)
MEAN = torch.tensor([1.0, -2.0], dtype=torch.float64)
CHAINS, BURN_IN, SAMPLES, LR = 2000, 800, 800, 0.02


def _sample(preconditioned: bool, s: float = 2.0) -> torch.Tensor:
    chains = torch.nn.Parameter(torch.zeros(CHAINS, 2, dtype=torch.float64))
    optimizer = Langevin([chains], lr=LR, s=s, seed=0, preconditioned=preconditioned, alpha=0.999)
    draws = []
    for step in range(BURN_IN + SAMPLES):
        # grad of sum over chains of V: (x - m) P, computed directly (no autograd needed).
        chains.grad = (chains.detach() - MEAN) @ PRECISION
        optimizer.step()
        if step >= BURN_IN and step % 4 == 0:
            draws.append(chains.detach().clone())
    return torch.cat(draws)


def _moments(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return samples.mean(dim=0), torch.cov(samples.T)


def test_langevin_samples_the_gaussian():
    mean, covariance = _moments(_sample(preconditioned=False))
    step = torch.eye(2, dtype=torch.float64) - LR * PRECISION
    discrete = torch.from_numpy(
        solve_discrete_lyapunov(step.numpy(), 2 * LR * torch.eye(2).numpy())
    )
    continuous = torch.linalg.inv(PRECISION)
    torch.testing.assert_close(mean, MEAN, atol=0.02, rtol=0)
    torch.testing.assert_close(covariance, discrete, atol=0.03, rtol=0)
    torch.testing.assert_close(covariance, continuous, atol=0.08, rtol=0)
    # The tolerance is tight enough to tell the temperature apart: s = 1 halves the covariance.
    assert (covariance - continuous / 2).abs().max() > 0.3


def test_s_sets_the_temperature():
    _, covariance = _moments(_sample(preconditioned=False, s=1.0))  # temperature 1/2
    torch.testing.assert_close(covariance, torch.linalg.inv(PRECISION) / 2, atol=0.05, rtol=0)


def test_preconditioned_langevin_samples_the_gaussian():
    # pSGLD drops the divergence term of its preconditioner, hence a looser tolerance.
    mean, covariance = _moments(_sample(preconditioned=True))
    torch.testing.assert_close(mean, MEAN, atol=0.05, rtol=0)
    torch.testing.assert_close(covariance, torch.linalg.inv(PRECISION), atol=0.1, rtol=0)
