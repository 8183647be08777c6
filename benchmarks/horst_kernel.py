"""HORST's compiled update over one flat buffer, against fused AdamW on the same buffer.

`optimizer_step.py` times the optimizers as a user runs them: many tensors, the guard, the
per-tensor bookkeeping. This times only the arithmetic: `_fast.compiled_horst_step` on a
single flat tensor of `--millions` M float32 elements (one compiled call, no guard), with the
polynomial exp and with torch.exp, next to `torch.optim.AdamW(fused=True)` on one parameter of
the same size and the 7-stream bandwidth reference (read theta, grad, m, v; write theta, m, v).
The gap between this ratio and optimizer_step.py's "no guard" row is what the multi-tensor
path costs beyond the arithmetic.

Run: python benchmarks/horst_kernel.py [--millions 26] [--rounds 10]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from convergent.optim import HorstHyperparameters, _fast


def _fastest(configurations: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    for run in configurations.values():
        run()
        run()  # compile and warm up
    best = dict.fromkeys(configurations, float("inf"))
    for _ in range(rounds):  # interleaved, so that a busy moment hits every configuration
        for name, run in configurations.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--millions", type=float, default=26.0)
    parser.add_argument("--rounds", type=int, default=10)
    arguments = parser.parse_args()
    count = int(arguments.millions * 1e6)
    generator = torch.Generator().manual_seed(0)
    theta = torch.randn(count, generator=generator)
    grad = torch.randn(count, generator=generator) * 1e-3
    exp_avg, exp_avg_sq = torch.zeros(count), torch.full((count,), 1e-6)
    hyperparameters = HorstHyperparameters(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8,
                                           weight_decay=0.01, alpha=1.0, beta=1e-3)  # fmt: skip

    def horst(polynomial: bool) -> Callable[[], object]:
        return lambda: _fast.compiled_horst_step(
            [theta], [grad], [exp_avg], [exp_avg_sq], [10.0], [True], hyperparameters,
            polynomial=polynomial,
        )  # fmt: skip

    parameter = torch.nn.Parameter(theta.clone())
    parameter.grad = grad.clone()
    adamw = torch.optim.AdamW([parameter], lr=1e-4, fused=True)
    streams = [torch.ones(count) for _ in range(4)]

    def bandwidth() -> None:
        streams[0].add_(streams[1])
        streams[2].mul_(1.0)
        streams[3].mul_(1.0)

    times = _fastest(
        {
            "AdamW (fused)": adamw.step,
            "bandwidth reference (7 streams)": bandwidth,
            "HORST kernel, polynomial exp": horst(True),
            "HORST kernel, torch.exp": horst(False),
        },
        arguments.rounds,
    )
    reference = times["AdamW (fused)"]
    print(f"{count / 1e6:.1f} M float32 elements in one tensor, {torch.get_num_threads()} threads")
    print("| step | ms | / AdamW fused |\n|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {seconds / reference:.2f}x |")


if __name__ == "__main__":
    main()
