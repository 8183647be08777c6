"""Pruned models on disk and on the CPU: size and forward speed, dense against sparse kernels.

For each model and setting (dense; magnitude-pruned to 50, 70, 90 and 95 %; 2:4) this prints
the compressed weights file over the dense one (same dtype) and the speed-up of a ``[1, T]``
forward pass (no KV cache) through ``to_sparse_kernels`` over the same pruned model run
dense, at T = 1, 16 and 128 tokens, with 1 and 2 threads. Each speed-up is the median, over
``--rounds`` rounds, of the median ratio of back-to-back dense and sparse samples, all in one
process: the machine's load falls on both alike.

    python benchmarks/sparse_inference.py --model charlm=runs/bench/charlm-128 \\
        --model gpt2=runs/bench/gpt2-austen --model charlm512=runs/bench/charlm-512
    python benchmarks/sparse_inference.py --horst-case runs/bench/horst   # HORST against AdamW

``--horst-case FOLDER`` retrains the sparsity study's character LMs (AdamW and HORST at the
configurations its full run selected, docs/results/sparsity-full/results.json, first final
seed) unless FOLDER holds them, prunes each to 90 % by magnitude with the study's masks and
prints test perplexity, size and speed side by side.

Targets (d_model >= 512 char LM at 90 % unstructured): a weights file at most 20 % of the
dense one, and a forward at least 2x faster than dense at T = 16 on one thread.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from convergent.commands.benchmark import load_for_bench, model_inputs
from convergent.commands.compressed import positive_zeros_
from convergent.sparse import MaskSpec, prune_one_shot
from convergent.sparse.kernels import fastest_speedup, timed_samples, to_sparse_kernels
from convergent.sparse.storage import group_dims, write_compressed_file

SETTINGS: list[tuple[str, float | None, str]] = [
    ("dense", None, "unstructured"),
    ("50 %", 0.5, "unstructured"),
    ("70 %", 0.7, "unstructured"),
    ("90 %", 0.9, "unstructured"),
    ("95 %", 0.95, "unstructured"),
    ("2:4", 0.5, "2:4"),
]
TARGET_SIZE = 0.20
TARGET_SPEEDUP = 2.0
RESULTS = Path("docs/results/sparsity-full/results.json")


def file_ratio(model: nn.Module) -> float:
    """The compressed weights file's bytes over the dense safetensors file's."""
    with tempfile.TemporaryDirectory() as folder:
        dense, compressed = Path(folder) / "dense.safetensors", Path(folder) / "sparse.safetensors"
        save_model(model, str(dense))
        write_compressed_file(compressed, model.state_dict(), group_dims(model))
        return compressed.stat().st_size / dense.stat().st_size


@torch.no_grad()
def speedups(
    model: nn.Module, lengths: list[int], threads: list[int], rounds: int
) -> dict[str, dict[str, Any]]:
    """``{"t1": {"T=16": {"speedup", "layers"}}}``: sparse kernels over dense, per setting."""
    result: dict[str, dict[str, Any]] = {}
    for count in threads:
        torch.set_num_threads(count)
        per_length = {}
        for tokens in lengths:
            sparse = copy.deepcopy(model)
            report = to_sparse_kernels(sparse, tokens=tokens)
            inputs = model_inputs(model, tokens)
            ratios = []
            for _ in range(rounds):
                dense, fast = timed_samples([lambda: model(**inputs), lambda: sparse(**inputs)])  # noqa: B023
                ratios.append(fastest_speedup(dense, fast))
            per_length[f"T={tokens}"] = {
                "speedup": statistics.median(ratios),
                "rounds": ratios,
                "layers": f"{len(report.converted)}/{len(report.layers)}",
            }
        result[f"t{count}"] = per_length
    return result


def measure(
    model: nn.Module, lengths: list[int], threads: list[int], rounds: int, only: list[str]
) -> list[dict]:
    """Each setting of :data:`SETTINGS` (those named in ``only``, or all) on a copy of ``model``."""
    rows = []
    for label, sparsity, pattern in SETTINGS:
        if only and label not in only:
            continue
        pruned = copy.deepcopy(model)
        if sparsity is not None:
            prune_one_shot(pruned, sparsity, spec=MaskSpec(pattern=pattern))
            positive_zeros_(pruned)
        started = time.perf_counter()
        row = {
            "setting": label,
            "size": file_ratio(pruned),
            # Unpruned, no layer is a candidate: the "sparse" model is the dense one.
            "speed": speedups(pruned, lengths, threads, rounds) if sparsity is not None else {},
        }
        row["seconds"] = time.perf_counter() - started
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(name: str, rows: list[dict], lengths: list[int], threads: list[int]) -> str:
    """One table per model: size ratio, then the speed-up per thread count and length."""
    columns = [f"{t} thr, T={n}" for t in threads for n in lengths]
    lines = [
        f"| {name} | file / dense | " + " | ".join(columns) + " |",
        "|---" * (2 + len(columns)) + "|",
    ]
    for row in rows:
        if not row["speed"]:
            cells = ["1x (no pruned layer)"] * len(columns)
            lines.append(f"| {row['setting']} | {row['size']:.3f} | " + " | ".join(cells) + " |")
            continue
        cells = [
            f"{row['speed'][f't{t}'][f'T={n}']['speedup']:.2f}x "
            f"({row['speed'][f't{t}'][f'T={n}']['layers']})"
            for t in threads
            for n in lengths
        ]
        lines.append(f"| {row['setting']} | {row['size']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def horst_case(folder: Path, threads: list[int], rounds: int) -> dict[str, Any]:
    """The sparsity study's AdamW and HORST char LMs, retrained, pruned to 90 %, side by side."""
    from convergent.studies.sparsity.config import LANGUAGE_MODEL_MASKS, Config
    from convergent.studies.sparsity.models import language_data, language_model
    from convergent.studies.sparsity.runs import (
        Recipe,
        dataset_perplexity,
        train_language_model,
    )

    stored = json.loads(RESULTS.read_text())
    config = Config(**stored["config"])
    selected = stored["data"]["language"]["selected"]
    seed = config.seeds[0]
    torch.set_num_threads(config.threads)
    splits, _, test = language_data(
        config.lm_seq_len, config.lm_validation_windows, config.lm_test_windows
    )
    shape = {"d_model": config.lm_d_model, "n_layers": config.lm_layers,
             "n_heads": config.lm_heads, "d_ff": config.lm_d_ff}  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    rows = {}
    for optimizer in ("adamw", "horst"):
        path = folder / f"{optimizer}-seed{seed}.safetensors"
        model = language_model(splits.vocab_size, splits.seq_len, **shape)
        if path.is_file():
            load_model(model, str(path))
        else:
            started = time.perf_counter()
            trained = train_language_model(
                splits, splits.train, Recipe(shape, config.lm_steps, config.lm_batch_size),
                optimizer, config.options(optimizer, selected[optimizer]), seed,
            )  # fmt: skip
            assert trained is not None, f"{optimizer} diverged"
            model = trained.model
            save_model(model, str(path))
            print(f"{optimizer}: trained in {time.perf_counter() - started:.0f} s", flush=True)
        model.eval()
        dense_perplexity = dataset_perplexity(model, test)
        pruned = copy.deepcopy(model)
        prune_one_shot(pruned, 0.9, spec=LANGUAGE_MODEL_MASKS)
        positive_zeros_(pruned)
        lengths = [1, 16, config.lm_seq_len]
        rows[optimizer] = {
            "selected": selected[optimizer],
            "seed": seed,
            "dense perplexity": dense_perplexity,
            "90 % perplexity": dataset_perplexity(pruned, test),
            "size": file_ratio(pruned),
            "speed": speedups(pruned, lengths, threads, rounds),
        }
        print(json.dumps({optimizer: rows[optimizer]}), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], metavar="NAME=FOLDER")
    parser.add_argument("--horst-case", type=Path, default=None, metavar="FOLDER")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--settings",
        nargs="+",
        default=[],
        help=f"a subset of {[label for label, *_ in SETTINGS]}".replace("%", "%%"),
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    arguments = parser.parse_args()
    print(f"torch {torch.__version__}, threads {arguments.threads}, rounds {arguments.rounds}")
    results: dict[str, Any] = {}
    tables = []
    for entry in arguments.model:
        name, _, folder = entry.partition("=")
        model, description = load_for_bench(folder)
        print(f"{name}: {folder} ({description})", flush=True)
        rows = measure(
            model, arguments.lengths, arguments.threads, arguments.rounds, arguments.settings
        )
        results[name] = rows
        tables.append(markdown(name, rows, arguments.lengths, arguments.threads))
        ninety = next((row for row in rows if row["setting"] == "90 %"), None)
        wide = "512" in name or getattr(getattr(model, "config", None), "d_model", 0) >= 512
        if ninety is not None and wide:
            speed = ninety["speed"].get("t1", {}).get("T=16", {}).get("speedup")
            print(f"{name} at 90 %: file {ninety['size']:.3f} of dense (target <= "
                  f"{TARGET_SIZE}: {'met' if ninety['size'] <= TARGET_SIZE else 'NOT met'}); "
                  f"T=16, 1 thread {speed}x (target >= {TARGET_SPEEDUP}: "
                  f"{'met' if speed and speed >= TARGET_SPEEDUP else 'NOT met'})")  # fmt: skip
    if arguments.horst_case is not None:
        results["horst_case"] = horst_case(
            arguments.horst_case, arguments.threads, arguments.rounds
        )
    print("\n\n".join(tables))
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
