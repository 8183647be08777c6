"""Exact N(0, 1) sources on CPU, as ratios to one `torch.Tensor.normal_` draw of the same size.

Langevin's step cost on CPU is its Gaussian draw. This compares, for `--millions` M float32
numbers (one buffer, filled in place):

- torch's `normal_` with one generator (the reference: what `Langevin(noise_streams=1)` does);
- `normal_` on two halves from two generators in two threads (`noise_streams=2`);
- inductor's counter-based `randn` inside a compiled `x + scale * randn_like(x)`;
- numpy's ziggurat (`Generator.standard_normal(out=..., dtype=float32)`) with PCG64 and SFC64;
- an SGD-like axpy over the same buffer (the update the noise is added to), for scale.

The fastest of several rounds counts (the machine may be shared).

Run: python benchmarks/noise_sources.py [--millions 26] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch


def _fastest(run: Callable[[], object], rounds: int) -> float:
    run()  # warm-up (and compile)
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--millions", type=float, default=26.0)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    count = int(arguments.millions * 1e6)
    out = torch.empty(count)
    generators = [torch.Generator().manual_seed(index) for index in range(2)]
    pool = ThreadPoolExecutor(2)
    halves = out.tensor_split(2)

    def two_threads() -> None:
        futures = [
            pool.submit(half.normal_, generator=generator)
            for half, generator in zip(halves, generators, strict=True)
        ]
        for future in futures:
            future.result()

    compiled = torch.compile(lambda x, scale: x.add_(torch.randn_like(x) * scale), fullgraph=True)
    array = out.numpy()
    numpy_generators = {
        "PCG64": np.random.Generator(np.random.PCG64(0)),
        "SFC64": np.random.Generator(np.random.SFC64(0)),
    }
    configurations: dict[str, Callable[[], object]] = {
        "torch normal_, one generator (reference)": lambda: out.normal_(generator=generators[0]),
        "torch normal_, two generators in two threads": two_threads,
        "inductor randn in a compiled update": lambda: compiled(out, 0.1),
    }
    for name, generator in numpy_generators.items():
        configurations[f"numpy ziggurat, {name}"] = lambda generator=generator: (
            generator.standard_normal(out=array, dtype=np.float32)
        )
    configurations["axpy over the buffer (an SGD update)"] = lambda: out.add_(out, alpha=0.0)
    times = {name: _fastest(run, arguments.rounds) for name, run in configurations.items()}
    reference = times["torch normal_, one generator (reference)"]
    print(f"{count / 1e6:.1f} M float32 numbers, {torch.get_num_threads()} torch threads")
    print("| source | ms | / reference | ns per number |\n|---|---|---|---|")
    for name, seconds in times.items():
        print(
            f"| {name} | {seconds * 1e3:.1f} | {seconds / reference:.2f}x | "
            f"{seconds / count * 1e9:.2f} |"
        )


if __name__ == "__main__":
    main()
