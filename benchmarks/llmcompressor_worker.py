"""llm-compressor's side of ``llmcompressor_compare.py``: one model, method and target, in
llm-compressor's own virtual environment (it imports no ``convergent``); prints one JSON line.

    runs/llmcompressor-venv/bin/python benchmarks/llmcompressor_worker.py FOLDER WINDOWS \\
        METHOD TARGET BLOCK_CLASS [--owl]

METHOD is magnitude, wanda or sparsegpt; TARGET 0.5, 0.7, 2:4 or dense (evaluate only).
BLOCK_CLASS: LlamaDecoderLayer, GPT2Block or BertLayer (a sentence encoder, scored by the mean
cosine of its pooled embeddings to its dense ones, taken in this process before pruning).
The recipe prunes the linear layers inside the decoder blocks (``targets`` = the block class,
``ignore`` = ``re:.*lm_head``), with SparseGPT's block size 128 and damping 0.01 (both
libraries' defaults). The timed call is the whole ``oneshot``, as a user runs it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_common import (  # after the path that finds it
    dense_reference,
    load_model,
    load_windows,
    prunable_zeros,
    quality,
)
from resident import PeakResident

BATCH_SIZE = 16  # the calibration batch size, the same on our side


def block_linear_names(model: nn.Module, block_class: str) -> list[str]:
    """The names of the linear layers inside the blocks of class ``block_class``."""
    names = []
    for block_name, block in model.named_modules():
        if type(block).__name__ != block_class:
            continue
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear):
                names.append(f"{block_name}.{name}")
    return names


def recipe(method: str, target: str, model: nn.Module, block_class: str, owl: bool) -> Any:
    from llmcompressor.modifiers.pruning import (
        MagnitudePruningModifier,
        SparseGPTModifier,
        WandaPruningModifier,
    )

    n_m = target == "2:4"
    sparsity = 0.5 if n_m else float(target)
    if method == "magnitude":
        names = block_linear_names(model, block_class)
        # parameter targets (module names); a block class would also match its norms
        pattern = "re:^(" + "|".join(re.escape(name) for name in names) + ")$"
        return MagnitudePruningModifier(
            targets=[pattern],
            init_sparsity=sparsity,
            final_sparsity=sparsity,
            start=0,
            end=1,
            update=1,
            mask_structure="2:4" if n_m else "unstructured",
        )
    common: dict[str, Any] = {
        "sparsity": sparsity,
        "mask_structure": "2:4" if n_m else "0:0",
        "targets": [block_class],
        "ignore": ["re:.*lm_head"],
    }
    if owl:
        common.update(sparsity_profile="owl", owl_m=5, owl_lmbda=0.08)
    if method == "wanda":
        return WandaPruningModifier(**common)
    return SparseGPTModifier(**common, block_size=128, dampening_frac=0.01)


def measure(folder: str, windows_path: str, method: str, target: str, block_class: str,
            owl: bool) -> dict[str, Any]:  # fmt: skip
    torch.manual_seed(0)
    model = load_model(folder)
    windows = load_windows(windows_path)
    reference = dense_reference(model, windows)
    row: dict[str, Any] = {"library": "llm-compressor", "method": method, "target": target}
    row["threads"] = torch.get_num_threads()
    if owl:
        row["distribution"] = "owl"
    if target != "dense":
        from datasets import Dataset
        from llmcompressor import oneshot

        calibration = windows["calibration"]
        mask = windows.get("calibration_mask", torch.ones_like(calibration))
        dataset = Dataset.from_dict(
            {"input_ids": calibration.tolist(), "attention_mask": mask.tolist()}
        )
        modifier = recipe(method, target, model, block_class, owl)
        with PeakResident() as memory:
            start, cpu_start = time.perf_counter(), time.process_time()
            try:
                oneshot(
                    model=model,
                    dataset=dataset,
                    recipe=[modifier],
                    num_calibration_samples=len(calibration),
                    shuffle_calibration_samples=False,
                    max_seq_length=calibration.shape[1],
                    batch_size=BATCH_SIZE,
                )
            except Exception as error:  # reported in the table, not hidden
                row["error"] = f"{type(error).__name__}: {error}"
                return row
            row["seconds"] = time.perf_counter() - start
            row["cpu seconds"] = time.process_time() - cpu_start
        row["peak MiB"] = memory.above_start
        zeros, entries = prunable_zeros(model)
        row["sparsity"] = zeros / max(entries, 1)
        row["entries"] = entries
    row.update(quality(model, windows, reference))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("windows")
    parser.add_argument("method", choices=("magnitude", "wanda", "sparsegpt"))
    parser.add_argument("target", choices=("dense", "0.5", "0.7", "0.9", "2:4"))
    parser.add_argument("block_class")
    parser.add_argument("--owl", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    row = measure(
        arguments.folder,
        arguments.windows,
        arguments.method,
        arguments.target,
        arguments.block_class,
        arguments.owl,
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
