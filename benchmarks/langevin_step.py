"""Time per optimizer step: Langevin against torch.optim.SGD on the same parameters.

Target: a Langevin step with s > 0 costs at most 4x an SGD step (the Gaussian draw is the
only extra work; on CPU torch draws it on one thread, whatever the thread count, so the table
also shows ``noise_streams`` = one generator per thread). Two measurements, both as ratios to a reference timed in the same run:

1. the optimizer step alone, on `--millions` M float32 parameters (1024 x 1024 matrices plus
   one bias each) with fixed gradients: SGD(foreach) is the reference; Langevin with s = 0
   (must be ~1x: the same ops), with s > 0 (foreach and reference implementations), the
   noise draw alone, and preconditioned Langevin against RMSprop(foreach);
2. a whole training step (forward, backward, optimizer step) of a small Transformer on
   random data, SGD against Langevin with s > 0: what a training run actually pays.

Configurations run interleaved for several rounds and the fastest round counts (the machine
may be shared). On CPU the draw of N Gaussian numbers costs several times an axpy over N
floats, so (1) is far above 1x there; the table says so rather than hiding it.

Run: python benchmarks/langevin_step.py [--millions 4] [--rounds 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from convergent.models import Transformer, TransformerConfig
from convergent.optim.langevin import Langevin

TARGET = 4.0
# noise_streams for the parallel-draw row: one generator per core (2 on the reference machine).
STREAMS = max(2, min(torch.get_num_threads(), 8))


def _parameters(millions: int, device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    params = []
    for _ in range(millions):
        params.append(torch.randn(1024, 1024, generator=generator).to(device).requires_grad_())
        params.append(torch.randn(1024, generator=generator).to(device).requires_grad_())
    for param in params:
        param.grad = (torch.randn(param.shape, generator=generator) * 1e-3).to(device)
    return params


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(run: Callable[[], object], device: str, repeats: int) -> float:
    run()
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    _sync(device)
    return (time.perf_counter() - started) / repeats


def _fastest(configurations: dict[str, Callable[[], object]], device: str, rounds: int, repeats: int) -> dict[str, float]:  # fmt: skip
    best = {name: float("inf") for name in configurations}
    for _ in range(rounds):
        for name, run in configurations.items():
            best[name] = min(best[name], _time(run, device, repeats))
    return best


def optimizer_steps(millions: int, device: str, rounds: int) -> dict[str, float]:
    params = _parameters(millions, device)
    generator = torch.Generator(device=device).manual_seed(0)
    buffer = torch.empty(1024 * 1024, device=device)  # reused, as Langevin's scratch is
    configurations: dict[str, Callable[[], object]] = {
        "SGD(foreach)": torch.optim.SGD(params, lr=1e-3, foreach=True).step,
        "Langevin s=0": Langevin(params, lr=1e-3, s=0.0).step,
        "Langevin s>0 (foreach)": Langevin(params, lr=1e-3, s=1e-3, seed=0).step,
        f"Langevin s>0 (foreach, noise_streams={STREAMS})": Langevin(
            params, lr=1e-3, s=1e-3, seed=0, noise_streams=STREAMS
        ).step,
        "Langevin s>0 (reference)": Langevin(
            params, lr=1e-3, s=1e-3, seed=0, implementation="reference"
        ).step,
        "noise draw alone": lambda: [
            buffer[: p.numel()].normal_(generator=generator) for p in params
        ],
        "RMSprop(foreach)": torch.optim.RMSprop(params, lr=1e-5, foreach=True).step,
        "Langevin preconditioned s>0": Langevin(
            params, lr=1e-5, s=1e-3, seed=0, preconditioned=True
        ).step,
    }
    return _fastest(configurations, device, rounds, repeats=3)


def training_steps(device: str, rounds: int) -> dict[str, float]:
    config = TransformerConfig(task="regression", input_dim=16, num_outputs=16, pooling="token", d_model=64,
                               n_heads=4, n_layers=2, max_len=16)  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(64, 16, 16, generator=generator).to(device)
    labels = torch.randn(64, 16, 16, generator=generator).to(device)
    configurations: dict[str, Callable[[], object]] = {}
    for name, build in (("SGD(foreach)", lambda p: torch.optim.SGD(p, lr=1e-3, foreach=True)),
                        ("Langevin s>0", lambda p: Langevin(p, lr=1e-3, s=1e-3, seed=0))):  # fmt: skip
        torch.manual_seed(0)
        model = Transformer(config).to(device)
        optimizer = build(model.parameters())

        def step(model: Transformer = model, optimizer: torch.optim.Optimizer = optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(inputs=inputs).logits, labels).backward()
            optimizer.step()

        configurations[name] = step
    return _fastest(configurations, device, rounds, repeats=10)


def _print(title: str, times: dict[str, float], reference: str) -> None:
    print(f"\n{title} (fastest round; ratio to {reference})")
    print("| configuration | ms | ratio |\n|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {seconds / times[reference]:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--millions", type=int, default=4, help="parameters, in units of 1024 x 1024"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    steps = optimizer_steps(args.millions, args.device, args.rounds)
    _print(f"optimizer step, {args.millions} M parameters", steps, "SGD(foreach)")
    training = training_steps(args.device, args.rounds)
    _print(
        "training step of a 2-layer Transformer (d_model 64, batch 64 x 16 tokens)",
        training,
        "SGD(foreach)",
    )
    floor = steps["SGD(foreach)"] + steps["noise draw alone"]
    overhead = steps["Langevin s>0 (foreach)"] / floor
    print(
        f"\noptimizer step: Langevin / (SGD + noise draw alone) = {overhead:.2f}x: the cost beyond "
        "the draw itself (the draw alone is "
        f"{steps['noise draw alone'] / steps['SGD(foreach)']:.2f}x an SGD step here)"
    )
    ratio = steps["Langevin s>0 (foreach)"] / steps["SGD(foreach)"]
    whole = training["Langevin s>0"] / training["SGD(foreach)"]
    print(
        f"\noptimizer step: Langevin / SGD = {ratio:.2f}x (target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'})"
    )
    streamed = steps[f"Langevin s>0 (foreach, noise_streams={STREAMS})"] / steps["SGD(foreach)"]
    print(
        f"optimizer step: Langevin(noise_streams={STREAMS}) / SGD = {streamed:.2f}x (target <= "
        f"{TARGET}x: {'met' if streamed <= TARGET else 'NOT met'})"
    )
    print(
        f"training step:  Langevin / SGD = {whole:.2f}x (target <= {TARGET}x: {'met' if whole <= TARGET else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
