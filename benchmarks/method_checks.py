"""What the live manipulation checks cost: `MethodChecks.after_step` against a training step.

For each optimizer the checks read (HORST, HAM around AdamW, Langevin) and for the descent
checks, one model and batch; a training step is forward + backward + optimizer step (+ the
training step's after-step work). The checks run after each step as `fit` calls them, with
`every` = the run's length / 20: most steps pay only their bookkeeping, every `every`-th step
a reading (a float64 pass over the weights and moments for the mirror ratio; for Langevin the
last `WINDOW_STEPS` steps before a reading add their gradient move to a float64 buffer).
Prints, per case, the checks' mean time per step over a whole run as a share of the
training step's (target: at most 5 %), and a reading step's own cost.

    python benchmarks/method_checks.py [--steps 200] [--d-model 256] [--layers 4] [--threads 2]

The clock is this process's CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from convergent.models import Transformer, TransformerConfig
from convergent.optim import HAM, HORST, Langevin
from convergent.train import ErmStep, MethodChecks
from convergent.train.primal_dual import descent_step

CLOCK = time.process_time
TARGET = 0.05


def _model(d_model: int, layers: int) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        TransformerConfig(
            task="classification",
            num_outputs=10,
            input_dim=16,
            max_len=32,
            d_model=d_model,
            n_heads=4,
            n_layers=layers,
        )
    )


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "inputs": torch.randn(64, 32, 16, generator=generator),
        "labels": torch.randint(0, 10, (64,), generator=generator),
    }


def run(name: str, build: Callable[[torch.nn.Module], Any], step_for: Callable[[Any], Any],
        arguments: argparse.Namespace) -> tuple[float, float]:  # fmt: skip
    """(checks' share of a training step over the run, a reading step's share)."""
    model = _model(arguments.d_model, arguments.layers)
    optimizer = build(model)
    step = step_for(model)
    batch = _batch()
    checks = MethodChecks(optimizer, step, max_steps=arguments.steps)
    training, checking, reading = [], [], []
    for index in range(1, arguments.steps + 1):
        start = CLOCK()
        optimizer.zero_grad(set_to_none=True)
        loss, metrics = step.loss(model, batch)
        loss.backward()
        optimizer.step()
        metrics.update(step.after_optimizer_step(model))
        middle = CLOCK()
        checks.after_step(index, metrics, model)
        end = CLOCK()
        training.append(middle - start)
        checking.append(end - middle)
        if index % checks.every == 0:
            reading.append(end - middle)
    per_step = statistics.median(training)
    share = statistics.fmean(checking) / per_step
    read_share = statistics.median(reading) / per_step
    met = "yes" if share <= TARGET else "no"
    print(f"| {name} | {1e3 * per_step:.1f} ms | {100 * share:.2f} % | "
          f"{100 * read_share:.1f} % | {met} |")  # fmt: skip
    return share, read_share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    erm = lambda model: ErmStep("classification")  # noqa: E731
    print(f"{arguments.steps} steps, every = {max(1, arguments.steps // 20)}, d_model "
          f"{arguments.d_model}, {arguments.layers} layers, batch 64 x 32 tokens, "
          f"{torch.get_num_threads()} threads; target: checks <= {100 * TARGET:g} % of a step")  # fmt: skip
    print("| case | training step | checks over the run | a reading step | met |")
    print("|---|---|---|---|---|")
    run("HORST (mirror ratio)", lambda m: HORST(m.parameters(), lr=1e-3), erm, arguments)
    run("HAM around AdamW (mirror ratio, finite weights)",
        lambda m: HAM(torch.optim.AdamW(m.parameters(), lr=1e-3)), erm, arguments)  # fmt: skip
    run("Langevin (noise window, fit kept)",
        lambda m: Langevin(m.parameters(), lr=1e-2, s=1e-4, seed=0), erm, arguments)  # fmt: skip
    run("AdamW + descent constraints (lambda, slack from the metrics)",
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
        lambda m: descent_step("classification", m.num_layers, alpha=0.5, dual_lr=1.0),
        arguments)  # fmt: skip


if __name__ == "__main__":
    main()
