"""Known answer: on under-determined least squares, HORST's iterates approach the minimum-L1 fit.

The minimum-L1 interpolant comes from scipy's linprog. Adam's eps (10) sits above the
gradient scale so that S is a preconditioned gradient step (with eps = 1e-8 Adam is sign
descent on this deterministic problem, and neither optimizer finds the sparse fit).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from convergent.optim import (
    HORST,
    HyperbolicEntropyMap,
    adam_direction,
    horst_mirror_direction,
    mirror_step,
    steepest_descent_step,
)

ROWS, COLUMNS, NONZEROS = 20, 60, 4
LR, EPS, ALPHA, STEPS, INIT = 0.03, 10.0, 300.0, 4000, 1e-5


@pytest.fixture(scope="module")
def problem():
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(ROWS, COLUMNS, generator=generator, dtype=torch.float64) / ROWS**0.5
    sparse = torch.zeros(COLUMNS, dtype=torch.float64)
    support = torch.randperm(COLUMNS, generator=generator)[:NONZEROS]
    sparse[support] = 1 + torch.rand(NONZEROS, generator=generator, dtype=torch.float64)
    target = matrix @ sparse
    result = linprog(np.ones(2 * COLUMNS), A_eq=np.hstack([matrix.numpy(), -matrix.numpy()]),
                     b_eq=target.numpy(), bounds=(0, None), method="highs")  # fmt: skip
    assert result.status == 0
    return matrix, target, torch.from_numpy(result.x[:COLUMNS] - result.x[COLUMNS:])


def _lr(step: int) -> float:
    start = 0.8 * STEPS
    return (
        LR
        if step < start
        else LR * 0.5 * (1 + math.cos(math.pi * (step - start) / (STEPS - start)))
    )


def _start() -> torch.Tensor:
    return (
        INIT
        * torch.randn(
            COLUMNS, generator=torch.Generator().manual_seed(1), dtype=torch.float64
        ).sign()
    )


def _optimizer_path_end(matrix, target, make_optimizer) -> torch.Tensor:
    theta = _start().requires_grad_()
    optimizer = make_optimizer([theta])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr(step) / LR)
    for _ in range(STEPS):
        theta.grad = matrix.T @ (matrix @ theta.detach() - target)
        optimizer.step()
        schedule.step()
    return theta.detach()


def _relative_distance(theta, solution) -> float:
    return float((theta - solution).norm() / solution.norm())


def test_horst_approaches_the_minimum_l1_solution_and_adamw_does_not(problem):
    matrix, target, minimum_l1 = problem
    horst = _optimizer_path_end(matrix, target, lambda ps: HORST(
        [{"params": ps, "mirror": True}], lr=LR, eps=EPS, weight_decay=0.0, alpha=ALPHA,
        implementation="foreach"))  # fmt: skip
    adamw = _optimizer_path_end(
        matrix, target, lambda ps: torch.optim.AdamW(ps, lr=LR, eps=EPS, weight_decay=0.0)
    )
    assert (matrix @ horst - target).norm() < 1e-8  # an interpolating solution
    # Measured: HORST 0.25 and L1 norm 1.19x the minimum; AdamW 0.82 and 1.80x.
    assert _relative_distance(horst, minimum_l1) < 0.3
    assert float(horst.abs().sum()) < 1.25 * float(minimum_l1.abs().sum())
    assert (matrix @ adamw - target).norm() < 1e-3
    assert _relative_distance(adamw, minimum_l1) > 0.7
    assert float(adamw.abs().sum()) > 1.6 * float(minimum_l1.abs().sum())


def test_reversed_composition_measured(problem):
    """S∘M, with the same u as M∘S and the mirror step first.

    Measured, not the expectation of the issue ("S∘M behaves like S"): with the same
    direction u in both operators the two orders agree to first order in lr, and S∘M also
    approaches the minimum-L1 solution here (over four random instances the two orders
    agreed to 3 digits). This test pins that finding down.
    """
    matrix, target, minimum_l1 = problem
    theta = _start()
    exp_avg, exp_avg_sq = torch.zeros_like(theta), torch.zeros_like(theta)
    mirror_map = HyperbolicEntropyMap(0.0)
    for step in range(1, STEPS + 1):
        lr = _lr(step - 1)
        grad = matrix.T @ (matrix @ theta - target)
        direction = adam_direction(grad, exp_avg, exp_avg_sq, step=step, lr=lr,
                                   beta1=0.9, beta2=0.999, eps=EPS)  # fmt: skip
        dual_step = horst_mirror_direction(theta, direction, alpha=ALPHA, lr=lr, beta=0.0)
        theta = steepest_descent_step(mirror_step(theta, dual_step, mirror_map), direction, lr=lr)
    assert (matrix @ theta - target).norm() < 1e-8
    assert _relative_distance(theta, minimum_l1) < 0.3  # measured 0.246, as HORST
