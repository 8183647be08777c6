"""One-shot pruning of two trained language models: magnitude, Wanda and SparseGPT side by side.

For each model, method and target (50 %, 70 % and 2:4) a fresh process loads the model and
prunes it in place (layer-wise, every linear layer of the blocks, embeddings and the LM head
dense: ``MaskSpec()``), then evaluates it. It measures:

- validation perplexity (the same windows for every method; dense first);
- seconds per pruned layer (the whole ``prune_one_shot`` call, calibration passes included,
  divided by the number of pruned matrices), and as a ratio to magnitude's in the same run;
- peak resident memory of the pruning above the loaded model and data (the process's resident
  set sampled every millisecond during ``prune_one_shot``, minus its value just before; the
  largest of the three targets), and as a ratio to magnitude's.

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
import json
import subprocess
import sys
import time
from typing import Any

import torch
from resident import PeakResident

from convergent.commands.hf_folders import evaluation_batch_size, evaluation_data, load_hf_folder
from convergent.commands.runs import load_run
from convergent.sparse import METHODS, MaskSpec, prune_one_shot
from convergent.train import calibration_batches, evaluate

TARGETS: dict[str, tuple[float, MaskSpec]] = {
    "50%": (0.5, MaskSpec()),
    "70%": (0.7, MaskSpec()),
    "2:4": (0.5, MaskSpec(pattern="2:4")),
}
BATCH_SIZE = 16


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


def measure(
    kind: str, path: str, method: str, target: str, examples: int, calibration: int
) -> dict[str, Any]:
    """One model, method and target in this process: perplexity, seconds, layers, peak memory.

    The model is pruned in place before it is evaluated, so the peak above the loaded model
    and data is the pruning's own. ``target`` "dense" only evaluates.
    """
    torch.manual_seed(0)
    data = _load(kind, path, examples, calibration)
    model = data["model"].eval()
    row: dict[str, Any] = {"model": kind, "method": method, "target": target}
    if target != "dense":
        sparsity, spec = TARGETS[target]
        with PeakResident() as memory:
            start = time.perf_counter()
            report = prune_one_shot(
                model,
                sparsity,
                spec=spec,
                method=method,
                calibration=None if method == "magnitude" else data["calibration"],
            )
            row["seconds"] = time.perf_counter() - start
        row["layers"] = len(report.masks)
        row["sparsity"] = report.sparsity
        row["peak MiB above loaded"] = memory.above_start
    row["perplexity"] = evaluate(model, data["validation"], "lm", batch_size=data["batch_size"])[
        "perplexity"
    ]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpt2", help="a save_pretrained folder of examples/gpt2_austen.py")
    parser.add_argument("--charlm", help="a run folder of a character LM (convergent train)")
    parser.add_argument("--examples", type=int, default=256, help="validation windows")
    parser.add_argument("--calibration-examples", type=int, default=128)
    parser.add_argument(
        "--one", nargs=4, metavar=("KIND", "PATH", "METHOD", "TARGET"), help=argparse.SUPPRESS
    )
    arguments = parser.parse_args()
    if arguments.one:  # a child process: one model, method and target, one JSON line
        row = measure(*arguments.one, arguments.examples, arguments.calibration_examples)
        print(json.dumps(row))
        return
    rows = []
    for kind, path in (("gpt2", arguments.gpt2), ("charlm", arguments.charlm)):
        if path is None:
            continue
        runs = [("magnitude", "dense")] + [(m, t) for m in METHODS for t in TARGETS]
        for method, target in runs:
            command = [
                sys.executable, __file__, "--one", kind, path, method, target,
                "--examples", str(arguments.examples),
                "--calibration-examples", str(arguments.calibration_examples),
            ]  # fmt: skip
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(output.strip().splitlines()[-1]))
            print(f"done: {kind} {method} {target}", file=sys.stderr)
    print(table(rows))


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: one line per model and method, with time and memory as ratios to
    magnitude's on the same model (memory: the largest peak of the three targets)."""
    lines = [
        "| model | method | dense ppl | 50 % | 70 % | 2:4 | s / layer | vs magnitude |"
        " peak MiB | vs magnitude |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def summary(model: str, method: str) -> dict[str, Any]:
        mine = [r for r in rows if r["model"] == model and r["method"] == method]
        pruned = [r for r in mine if r["target"] != "dense"]
        return {
            **{r["target"]: r["perplexity"] for r in pruned},
            "seconds per layer": sum(r["seconds"] for r in pruned)
            / max(sum(r["layers"] for r in pruned), 1),
            "peak": max(r["peak MiB above loaded"] for r in pruned),
        }

    for model in dict.fromkeys(r["model"] for r in rows):
        dense = next(
            r["perplexity"] for r in rows if r["model"] == model and r["target"] == "dense"
        )
        base = summary(model, "magnitude")
        for method in METHODS:
            row = summary(model, method)
            time_ratio = row["seconds per layer"] / max(base["seconds per layer"], 1e-9)
            # Below a MiB the allocator's rounding decides; a ratio to it would mean nothing.
            memory_ratio = f"{row['peak'] / base['peak']:.1f}x" if base["peak"] >= 1 else "-"
            lines.append(
                f"| {model} | {method} | {dense:.2f} | {row['50%']:.2f} | {row['70%']:.2f} | "
                f"{row['2:4']:.2f} | {row['seconds per layer']:.3f} | {time_ratio:.1f}x | "
                f"{row['peak']:.0f} | {memory_ratio} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
