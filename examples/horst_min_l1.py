"""HORST versus AdamW on under-determined least squares: whose iterates find the minimum-L1 fit?

Every x with A x = b fits the data exactly; which one an optimizer reaches is its implicit
bias. The minimum-L1 interpolant (from a linear program) is the sparse one. This script runs
AdamW (the steepest-descent step S alone), HORST (M∘S: S, then the hyperbolic mirror step M)
and the reversed composition S∘M from the same small initialization, prints where each ends,
and plots the L1 norm and the distance to the minimum-L1 solution along the way.

Adam's eps is set above the gradient scale (eps = 10), so that S is a preconditioned
gradient step; with eps = 1e-8, Adam on this deterministic problem is sign descent, which
spreads mass over every coordinate before the mirror step can act.

Run: python examples/horst_min_l1.py [--output horst_min_l1.png]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
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


def problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A, b and the minimum-L1 solution of A x = b (from scipy's linprog)."""
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randn(ROWS, COLUMNS, generator=generator, dtype=torch.float64) / ROWS**0.5
    sparse = torch.zeros(COLUMNS, dtype=torch.float64)
    support = torch.randperm(COLUMNS, generator=generator)[:NONZEROS]
    sparse[support] = 1 + torch.rand(NONZEROS, generator=generator, dtype=torch.float64)
    target = matrix @ sparse
    # x = x_plus - x_minus with both >= 0 turns min ||x||_1 into a linear program.
    result = linprog(np.ones(2 * COLUMNS), A_eq=np.hstack([matrix.numpy(), -matrix.numpy()]),
                     b_eq=target.numpy(), bounds=(0, None), method="highs")  # fmt: skip
    minimum_l1 = torch.from_numpy(result.x[:COLUMNS] - result.x[COLUMNS:])
    return matrix, target, minimum_l1


def learning_rate(step: int) -> float:
    """Constant, then a cosine decay over the last fifth so that the iterates settle."""
    start = 0.8 * STEPS
    return (
        LR
        if step < start
        else LR * 0.5 * (1 + math.cos(math.pi * (step - start) / (STEPS - start)))
    )


def initial_point() -> torch.Tensor:
    signs = torch.randn(
        COLUMNS, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    ).sign()
    return INIT * signs


def run_optimizer(name: str, matrix: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    """The iterates of AdamW ("S") or HORST ("M∘S"), from the torch optimizers."""
    theta = initial_point().requires_grad_()
    if name == "S":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            [theta], lr=LR, eps=EPS, weight_decay=0.0
        )
    else:
        optimizer = HORST([{"params": [theta], "mirror": True}], lr=LR, eps=EPS, weight_decay=0.0,
                          alpha=ALPHA, implementation="reference")  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate(step) / LR)
    path = []
    for _ in range(STEPS):
        theta.grad = matrix.T @ (matrix @ theta.detach() - target)
        optimizer.step()
        schedule.step()
        path.append(theta.detach().clone())
    return path


def run_reversed(matrix: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    """S∘M: the same two operators with the same direction u, mirror step first."""
    theta = initial_point()
    exp_avg, exp_avg_sq = torch.zeros_like(theta), torch.zeros_like(theta)
    mirror_map = HyperbolicEntropyMap(0.0)
    path = []
    for step in range(1, STEPS + 1):
        lr = learning_rate(step - 1)
        grad = matrix.T @ (matrix @ theta - target)
        direction = adam_direction(grad, exp_avg, exp_avg_sq, step=step, lr=lr,
                                   beta1=0.9, beta2=0.999, eps=EPS)  # fmt: skip
        dual_step = horst_mirror_direction(theta, direction, alpha=ALPHA, lr=lr, beta=0.0)
        theta = steepest_descent_step(mirror_step(theta, dual_step, mirror_map), direction, lr=lr)
        path.append(theta.clone())
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="horst_min_l1.png", help="where to save the plot")
    arguments = parser.parse_args()
    matrix, target, minimum_l1 = problem()
    paths = {"AdamW (S)": run_optimizer("S", matrix, target),
             "HORST (M∘S)": run_optimizer("M∘S", matrix, target),
             "reversed (S∘M)": run_reversed(matrix, target)}  # fmt: skip
    print(f"minimum L1 norm (linprog): {minimum_l1.abs().sum():.4f}")
    for name, path in paths.items():
        last = path[-1]
        distance = (last - minimum_l1).norm() / minimum_l1.norm()
        residual = (matrix @ last - target).norm()
        print(f"{name:15s} L1 {last.abs().sum():.4f}  relative distance to min-L1 {distance:.3f}  "
              f"residual {residual:.1e}")  # fmt: skip

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    steps = torch.arange(1, STEPS + 1)
    for (name, path), style in zip(paths.items(), ("-", "-", "--"), strict=True):
        stacked = torch.stack(path)
        left.plot(steps, stacked.abs().sum(dim=1), style, label=name)
        right.plot(steps, (stacked - minimum_l1).norm(dim=1) / minimum_l1.norm(), style, label=name)
    left.axhline(float(minimum_l1.abs().sum()), color="black", linestyle="--", label="minimum L1")
    left.set(xlabel="step", ylabel="||x||_1", xscale="log", title="L1 norm of the iterates")
    right.set(
        xlabel="step",
        xscale="log",
        ylabel="relative distance",
        yscale="log",
        title="distance to the minimum-L1 fit",
    )
    left.legend()
    figure.tight_layout()
    figure.savefig(arguments.output, dpi=120)
    print(f"saved {arguments.output}")


if __name__ == "__main__":
    main()
