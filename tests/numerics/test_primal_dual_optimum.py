"""Known answers for primal-dual descent-constrained optimization.

Toy "layer losses" of one parameter x: f_0 = 2, f_1 = x^2 + 1, f_2 = (x - 2)^2, alpha = 0.
minimize f_2 s.t. f_1 <= f_0 (|x| <= 1) and f_2 <= f_1 (x >= 3/4):
x* = 1, lambda* = (1, 0) (KKT: 2(x - 2) + 2 lambda_1 x = 0 with the second constraint slack).
Resilient, cost c = 1: u_1 = x^2 - 1 and lambda_1 = c u_1 turn KKT into x^3 = 2, so
x* = 2^(1/3), lambda_1* = u_1* = 2^(2/3) - 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import NonlinearConstraint, minimize

from convergent.constrained import DescentConstraints, DualAscent, lagrangian


def _toy_losses(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.tensor(2.0, dtype=x.dtype), x[0] ** 2 + 1, (x[0] - 2) ** 2])


def _solve(losses_of, parameter, constraints, dual, steps=400, lr=0.05):
    primal = torch.optim.SGD([parameter], lr=lr)
    for _ in range(steps):
        primal.zero_grad()
        losses = losses_of(parameter)
        slacks = constraints(losses)
        lagrangian(losses[-1], slacks, dual.value(), dual.relaxation).backward()
        primal.step()
        dual.step(slacks.detach())
    return parameter.detach(), dual.value(), dual.slack()


def test_hard_constraints_reach_the_closed_form_optimum_and_multipliers():
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))
    constraints = DescentConstraints(2, alpha=0.0)
    dual = DualAscent(2, lr=0.5)
    dual.multipliers.double()
    x_final, lam, _ = _solve(_toy_losses, x, constraints, dual)
    assert float(x_final[0]) == pytest.approx(1.0, abs=1e-3)
    torch.testing.assert_close(lam, torch.tensor([1.0, 0.0], dtype=lam.dtype), atol=1e-3, rtol=0)


def test_resilient_relaxation_reaches_the_closed_form_optimum():
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))
    constraints = DescentConstraints(2, alpha=0.0)
    dual = DualAscent(2, lr=0.5, resilient_cost=1.0)
    dual.multipliers.double()
    dual.relaxation.double()
    x_final, lam, u = _solve(_toy_losses, x, constraints, dual)
    assert float(x_final[0]) == pytest.approx(2 ** (1 / 3), abs=1e-3)
    assert float(lam[0]) == pytest.approx(2 ** (2 / 3) - 1, abs=1e-3)
    assert float(u[0]) == pytest.approx(2 ** (2 / 3) - 1, abs=1e-3)
    assert float(lam[1]) == pytest.approx(0.0, abs=1e-6)


def test_gradient_slack_updates_reach_the_same_resilient_optimum():
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))
    constraints = DescentConstraints(2, alpha=0.0)
    dual = DualAscent(2, lr=0.5, resilient_cost=1.0, slack_update="gradient", slack_lr=0.5)
    dual.multipliers.double()
    dual.relaxation.double()
    x_final, lam, u = _solve(_toy_losses, x, constraints, dual)
    assert float(x_final[0]) == pytest.approx(2 ** (1 / 3), abs=1e-3)
    assert float(u[0]) == pytest.approx(float(lam[0]), abs=1e-3)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_quadratic_problem_in_two_dimensions_matches_scipy():
    # Layer losses f_l = s_l |x - c_l|^2 + o_l of x in R^2 (f_0 constant, s_l increasing, so
    # every constraint is convex) with alpha = 0.2; the first constraint is active at the
    # optimum. scipy's trust-constr gives the optimum and the multipliers.
    alpha = 0.2
    centers = np.array([[0.0, 0.0], [0.0, 0.0], [0.5, 0.0], [1.2, 0.5]])
    scales = np.array([0.0, 1.0, 1.5, 2.0])
    offsets = np.array([3.0, 1.0, 0.5, 0.2])
    centers_t, scales_t, offsets_t = (torch.tensor(a) for a in (centers, scales, offsets))

    def losses_of(x):
        return scales_t * ((x - centers_t) ** 2).sum(dim=1) + offsets_t

    def losses_np(x):
        return scales * ((x - centers) ** 2).sum(axis=1) + offsets

    def slacks_np(x):
        f = losses_np(x)
        return f[1:] - (1 - alpha) * f[:-1]

    reference = minimize(
        lambda x: losses_np(x)[-1],
        np.zeros(2),
        method="trust-constr",
        constraints=[NonlinearConstraint(slacks_np, -np.inf, 0.0)],
        options={"gtol": 1e-10, "xtol": 1e-12, "maxiter": 3000},
    )
    assert reference.status in (1, 2), reference.message
    expected_multipliers = np.abs(reference.v[0])
    assert expected_multipliers[0] > 0.1, "the first constraint must be active"

    x = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    constraints = DescentConstraints(3, alpha=alpha)
    dual = DualAscent(3, lr=0.3)
    dual.multipliers.double()
    x_final, lam, _ = _solve(losses_of, x, constraints, dual, steps=400, lr=0.1)
    np.testing.assert_allclose(x_final.numpy(), reference.x, atol=1e-4)
    np.testing.assert_allclose(lam.numpy(), expected_multipliers, atol=1e-4)
