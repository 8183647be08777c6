"""One-shot pruning of two trained language models: magnitude, Wanda and SparseGPT side by side.

For each model and method it prunes a fresh copy at 50 %, 70 % and 2:4 (layer-wise, every
linear layer of the blocks, embeddings and the LM head dense: ``MaskSpec()``) and measures:

- validation perplexity (the same windows for every method; dense first);
- seconds per pruned layer (the whole ``prune_one_shot`` call, calibration passes included,
  divided by the number of pruned matrices), and as a ratio to magnitude's in the same run;
- peak resident memory above the loaded model and data (``ru_maxrss`` of a fresh process per
  model and method), and as a ratio to magnitude's.

Wanda and SparseGPT calibrate on a seeded sample of the *training* split (128 windows by
default), never on the windows they are scored on.

The models (trained beforehand, see benchmarks/README.md):

- ``gpt2``: a ``save_pretrained`` folder from ``examples/gpt2_austen.py --until-flat``;
- ``charlm``: a run folder of ``convergent train`` (our Transformer as a character LM).

    python benchmarks/oneshot_pruning.py --gpt2 runs/gpt2-austen-bench \\
        --charlm runs/charlm-austen-bench [--calibration-examples 128] [--examples 256]
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from typing import Any

import torch

from convergent.commands.hf_folders import evaluation_batch_size, evaluation_data, load_hf_folder
from convergent.commands.runs import load_run
from convergent.sparse import METHODS, MaskSpec, prune_one_shot
from convergent.train import calibration_batches, evaluate

TARGETS: tuple[tuple[str, float, MaskSpec], ...] = (
    ("50%", 0.5, MaskSpec()),
    ("70%", 0.7, MaskSpec()),
    ("2:4", 0.5, MaskSpec(pattern="2:4")),
)
BATCH_SIZE = 16


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _load(kind: str, path: str, examples: int, calibration_examples: int) -> dict[str, Any]:
    """The model, its validation windows and its calibration batches."""
    if kind == "gpt2":
        loaded = load_hf_folder(path)
        validation = evaluation_data(loaded, "austen", examples=examples)
        train = evaluation_data(
            loaded, "austen", examples=calibration_examples, split="train"
        ).dataset
        batch_size = evaluation_batch_size(loaded, validation.max_length)
        return {
            "model": loaded.model,
            "validation": validation.dataset,
            "calibration": calibration_batches(train, len(train), BATCH_SIZE),
            "batch_size": batch_size,
        }
    run = load_run(path)
    validation = run.splits.validation
    if examples < len(validation):
        validation = validation.subset(torch.arange(examples))
    return {
        "model": run.model,
        "validation": validation,
        "calibration": calibration_batches(
            run.splits.train, min(calibration_examples, len(run.splits.train)), BATCH_SIZE
        ),
        "batch_size": 64,
    }


def measure(kind: str, path: str, method: str, examples: int, calibration: int) -> dict[str, Any]:
    """One model and method in this process: perplexities, seconds per layer, peak memory."""
    torch.manual_seed(0)
    data = _load(kind, path, examples, calibration)
    model = data["model"].eval()

    def perplexity(candidate: torch.nn.Module) -> float:
        return evaluate(candidate, data["validation"], "lm", batch_size=data["batch_size"])[
            "perplexity"
        ]

    row: dict[str, Any] = {"model": kind, "method": method, "dense": perplexity(model)}
    baseline = _peak_mib()
    seconds, layers = 0.0, 0
    for label, sparsity, spec in TARGETS:
        pruned = copy.deepcopy(model)
        start = time.perf_counter()
        report = prune_one_shot(
            pruned,
            sparsity,
            spec=spec,
            method=method,
            calibration=None if method == "magnitude" else data["calibration"],
        )
        seconds += time.perf_counter() - start
        layers += len(report.masks)
        row[label] = perplexity(pruned)
        row[f"{label} sparsity"] = report.sparsity
        del pruned
    row["seconds per layer"] = seconds / max(layers, 1)
    row["peak MiB above loaded"] = max(_peak_mib() - baseline, 0.0)
    row["calibration windows"] = 0 if method == "magnitude" else calibration
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpt2", help="a save_pretrained folder of examples/gpt2_austen.py")
    parser.add_argument("--charlm", help="a run folder of a character LM (convergent train)")
    parser.add_argument("--examples", type=int, default=256, help="validation windows")
    parser.add_argument("--calibration-examples", type=int, default=128)
    parser.add_argument(
        "--one", nargs=3, metavar=("KIND", "PATH", "METHOD"), help=argparse.SUPPRESS
    )
    arguments = parser.parse_args()
    if arguments.one:  # a child process: one model and method, one JSON line
        kind, path, method = arguments.one
        row = measure(kind, path, method, arguments.examples, arguments.calibration_examples)
        print(json.dumps(row))
        return
    rows = []
    for kind, path in (("gpt2", arguments.gpt2), ("charlm", arguments.charlm)):
        if path is None:
            continue
        for method in METHODS:
            command = [
                sys.executable, __file__, "--one", kind, path, method,
                "--examples", str(arguments.examples),
                "--calibration-examples", str(arguments.calibration_examples),
            ]  # fmt: skip
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(output.strip().splitlines()[-1]))
            print(f"done: {kind} {method}", file=sys.stderr)
    print(table(rows))


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table, with time and memory as ratios to magnitude's on the same model."""
    lines = [
        "| model | method | dense ppl | 50 % | 70 % | 2:4 | s / layer | vs magnitude |"
        " peak MiB | vs magnitude |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        base = next(r for r in rows if r["model"] == row["model"] and r["method"] == "magnitude")
        time_ratio = row["seconds per layer"] / max(base["seconds per layer"], 1e-9)
        memory_ratio = row["peak MiB above loaded"] / max(base["peak MiB above loaded"], 1e-9)
        lines.append(
            f"| {row['model']} | {row['method']} | {row['dense']:.2f} | {row['50%']:.2f} | "
            f"{row['70%']:.2f} | {row['2:4']:.2f} | {row['seconds per layer']:.3f} | "
            f"{time_ratio:.1f}x | {row['peak MiB above loaded']:.0f} | {memory_ratio:.1f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
