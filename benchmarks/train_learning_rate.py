"""Which learning rate `convergent train` should default to for a model trained from scratch.

Trains the README's from-scratch runs (our Transformer on fashion-mnist with AdamW and with
HORST, on austen, digits and weather-hourly) at the CLI's default size and length (250
steps) for each learning rate of a grid, and prints the validation score of each: the rate
that wins on most of them is `DEFAULT_LEARNING_RATES["transformer"]` in
`convergent/commands/config.py`. MiniLM keeps its fine-tuning rate (5e-5), which is not
measured here. One seed; the validation split only (the test split is never read).

    python benchmarks/train_learning_rate.py [--rates 3e-4 1e-3 3e-3] [--steps 250]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from convergent.commands import TrainConfig, run_training

# (data, optimizer): the README's from-scratch lines (their own --lr left out).
RUNS = (
    ("fashion-mnist", "adamw"),
    ("fashion-mnist", "horst"),
    ("austen", "adamw"),
    ("digits", "adamw"),
    ("weather-hourly", "adamw"),
)


def score(validation: dict[str, float]) -> tuple[str, float, bool]:
    """(name, value, higher is better) of a run's headline validation metric."""
    if "accuracy" in validation:
        return "accuracy", validation["accuracy"], True
    if "rmse" in validation:
        return "rmse", validation["rmse"], False
    return "perplexity", math.exp(validation["loss"]), False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3])
    parser.add_argument("--steps", type=int, default=250)
    arguments = parser.parse_args()
    wins = dict.fromkeys(arguments.rates, 0)
    print(f"| data | optimizer | {' | '.join(f'lr {rate:g}' for rate in arguments.rates)} |")
    print(f"|---|---|{'---|' * len(arguments.rates)}")
    with tempfile.TemporaryDirectory() as folder:
        for data, optimizer in RUNS:
            cells, values = [], []
            for rate in arguments.rates:
                config = TrainConfig(
                    data=data,
                    model="transformer",
                    optimizer=optimizer,
                    lr=rate,
                    steps=arguments.steps,
                    eval_every=0,
                    checkpoint_every=0,
                    device="cpu",
                )
                started = time.perf_counter()
                summary = run_training(
                    config, Path(folder) / f"{data}-{optimizer}-{rate:g}", progress=False
                )
                name, value, higher = score(summary["validation"])
                values.append(value if higher else -value)
                cells.append(f"{name} {value:.4f} ({time.perf_counter() - started:.0f} s)")
            best = arguments.rates[values.index(max(values))]
            wins[best] += 1
            print(f"| {data} | {optimizer} | {' | '.join(cells)} |", flush=True)
    print(
        "best on: "
        + ", ".join(f"lr {rate:g} {count} of {len(RUNS)}" for rate, count in wins.items())
    )


if __name__ == "__main__":
    main()
