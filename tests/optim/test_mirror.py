"""Mirror maps: inverse pairs, the mirror step, and the multiplicative limit."""

from __future__ import annotations

import pytest
import torch

from convergent.optim import (
    EuclideanMap,
    HyperbolicEntropyMap,
    horst_mirror_direction,
    mirror_step,
)


def test_grad_psi_star_inverts_grad_psi():
    theta = torch.linspace(-3, 3, 101, dtype=torch.float64)
    for mirror_map in (EuclideanMap(), HyperbolicEntropyMap(0.1), HyperbolicEntropyMap(10.0)):
        torch.testing.assert_close(mirror_map.grad_psi_star(mirror_map.grad_psi(theta)), theta)


def test_euclidean_mirror_step_is_a_gradient_step():
    theta, direction = torch.randn(10), torch.randn(10)
    assert torch.equal(mirror_step(theta, direction, EuclideanMap()), theta - direction)


def test_small_scale_tends_to_the_multiplicative_step():
    torch.manual_seed(0)
    theta = torch.randn(1000, dtype=torch.float64)
    theta = theta[theta.abs() > 1e-3]
    direction = 0.1 * torch.randn_like(theta)
    limit = mirror_step(theta, direction, HyperbolicEntropyMap(0.0))
    torch.testing.assert_close(limit, theta * torch.exp(-torch.sign(theta) * direction))
    close = mirror_step(theta, direction, HyperbolicEntropyMap(1e-9))
    torch.testing.assert_close(close, limit, rtol=1e-9, atol=0)
    # At a scale comparable to the weights the step is no longer sign-preserving.
    assert (
        torch.sign(mirror_step(theta, 50 * direction, HyperbolicEntropyMap(1.0)))
        != torch.sign(theta)
    ).any()


def test_large_scale_tends_to_the_euclidean_step_in_scaled_units():
    theta, direction = (
        torch.randn(50, dtype=torch.float64),
        1e-6 * torch.randn(50, dtype=torch.float64),
    )
    scale = 1e4
    step = mirror_step(theta, direction, HyperbolicEntropyMap(scale))
    # grad_psi ~ theta / scale near 0, so the primal step is scale * direction.
    torch.testing.assert_close(step, theta - scale * direction, rtol=1e-6, atol=1e-9)


def test_scale_is_validated_and_scale_zero_has_no_dual_coordinates():
    with pytest.raises(ValueError, match="scale must be a finite number >= 0"):
        HyperbolicEntropyMap(-1.0)
    with pytest.raises(ValueError, match="no finite dual coordinates"):
        HyperbolicEntropyMap(0.0).grad_psi(torch.ones(2))


@pytest.mark.parametrize(
    ("theta_dtype", "direction_dtype", "direction_shape"),
    [
        (torch.float32, torch.float32, (7, 5)),
        (torch.float64, torch.float64, (7, 5)),
        (torch.float32, torch.float64, (7, 5)),  # promoted
        (torch.float64, torch.float32, (7, 5)),  # promoted: the sum cannot be done in place
        (torch.float64, torch.float64, (5,)),  # broadcast
    ],
)
def test_the_multiplicative_steps_give_the_formulas_bits(
    theta_dtype, direction_dtype, direction_shape
):
    # Written out as the docstrings state them, out of place: the library's in-place versions
    # must give the same bits, and must not change their inputs.
    generator = torch.Generator().manual_seed(3)
    theta = torch.randn(7, 5, generator=generator, dtype=torch.float64).to(theta_dtype)
    direction = (1e-2 * torch.randn(direction_shape, generator=generator, dtype=torch.float64)).to(
        direction_dtype
    )
    theta[0, 0] = 0.0
    kept_theta, kept_direction = theta.clone(), direction.clone()
    expected = theta * torch.exp(-(torch.sign(theta) * direction))
    stepped = HyperbolicEntropyMap(0.0).step(theta, direction)
    assert stepped.dtype == expected.dtype and torch.equal(stepped, expected)
    alpha, lr, beta = 3.0, 0.01, 0.5
    expected_dual = alpha * direction + (lr * beta) * torch.sign(theta)
    dual = horst_mirror_direction(theta, direction, alpha=alpha, lr=lr, beta=beta)
    assert dual.dtype == expected_dual.dtype and dual.shape == expected_dual.shape
    assert torch.equal(dual, expected_dual)
    assert torch.equal(theta, kept_theta) and torch.equal(direction, kept_direction)
