"""Peak memory of SparseGPT on a Llama-style model: loaded whole, then streamed block by block.

Each run is ``convergent prune FOLDER --method sparsegpt --sparsity 0.5`` in a fresh process:

- *in memory*: the model loaded whole, as the command does by default;
- *streamed*: ``--low-memory --save OUT`` (blocks read one at a time from the folder's
  safetensors files, each pruned block written to ``OUT`` as one compressed shard).

The models are random (seeded) Llama configurations saved with ``save_pretrained`` (this
measures memory, not quality); every block has the same size, only their number changes. The
in-memory run prunes the largest model (at least 1 GB of float32 weights at the defaults); the
streamed runs prune every size, to show that their peak does not grow with the model.

Peak memory: the child process imports everything the command will use (torch,
transformers' Llama, safetensors, accelerate, convergent), then resets the kernel's resident
high-water mark (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0) and reads its resident
size (``VmRSS``) as the baseline. After the command returns, ``VmHWM`` is the largest resident
size since the reset: exact, not sampled, and every page counts (anonymous and file-backed,
such as safetensors' memory maps). The peak reported is ``VmHWM - baseline``.

The reference a streamed run is held to (its target: at most 1.5x) is what the block-by-block
driver must hold at once, computed from the config:

- one block's weights in float32;
- its Hessians ``X^T X`` in the statistics dtype (``--statistics``: float32, the command's
  default, or float64, the library's), as :class:`convergent.sparse.calibration.Statistics`
  holds them: one per distinct input (q, k and v share one, as do gate and up), all of a
  block's alive until its layers are pruned;
- the calibration hidden states, ``[examples, max_length, d_model]`` in float32.

The modules outside the blocks (here the token embedding, tied to the LM head) are read for
the passes that run them (up to the first block, the head after the last, the last shard)
and dropped after, so they are not held while a block is pruned; they are printed beside the
reference, not counted in it.

glibc's allocator keeps freed memory in its heaps (its mmap threshold rises after each large
free), and that counts in the resident size; the streamed command fixes the threshold itself
(benchmarks/README.md).

    python benchmarks/streamed_memory.py        # d_model 1536: 1.09 GB of weights at 8 blocks
    python benchmarks/streamed_memory.py --d-model 768 --intermediate 2048 --heads 12
    python benchmarks/streamed_memory.py --blocks 2 --in-memory-blocks 0 ...   # one run alone

The time is SparseGPT's float64 arithmetic, which grows with d_model times the weights: the
default sizes took about 7 minutes on an idle 2-core machine, far longer under load
(benchmarks/README.md has the figures).
Runs of one size each (``--blocks N --in-memory-blocks 0``, ``--blocks --in-memory-blocks 8``)
may run side by side: each peak is its own process's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KIB = 1024
MIB = 2**20
STATUS = "/proc/self/status"


def _status_kib(field: str) -> int:
    with open(STATUS) as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"{STATUS} has no {field} line")


def child(prune_arguments: list[str]) -> None:
    """Run ``convergent prune`` with ``prune_arguments`` in this process; print one JSON line
    with the baseline after imports, the peak above it and the seconds."""
    import accelerate  # noqa: F401 (imported before the baseline, as the command imports it)
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: F401

    from convergent.cli import main
    from convergent.commands import prune, prune_streamed  # noqa: F401

    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the high-water mark restarts at the current resident size
    baseline = _status_kib("VmRSS")
    start = time.perf_counter()
    status = main(["prune", *prune_arguments])
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    print(json.dumps({"status": status, "baseline_kib": baseline, "peak_kib": peak,
                      "seconds": seconds}))  # fmt: skip


def library_child(prune_arguments: list[str]) -> None:
    """The library call the command is held to: ``prune_one_shot`` on the loaded model, with
    the command's calibration batches, no evaluation; one JSON line as :func:`child`."""
    import accelerate  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: F401

    from convergent.commands.hf_folders import evaluation_data, load_hf_folder
    from convergent.commands.prune import CALIBRATION_BATCH_SIZE
    from convergent.sparse import prune_one_shot
    from convergent.train import calibration_batches

    folder = prune_arguments[0]
    options = dict(zip(prune_arguments[1::2], prune_arguments[2::2], strict=False))
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    baseline = _status_kib("VmRSS")
    start = time.perf_counter()
    loaded = load_hf_folder(folder)
    source = evaluation_data(loaded, "austen", max_length=int(options["--max-length"]),
                             examples=int(options["--calibration-examples"]), split="train")  # fmt: skip
    batches = calibration_batches(source.dataset, len(source.dataset), CALIBRATION_BATCH_SIZE, 0)
    prune_one_shot(loaded.model, 0.5, method="sparsegpt", calibration=batches,
                   options={"statistics": options["--statistics"]})  # fmt: skip
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    print(json.dumps({"status": 0, "baseline_kib": baseline, "peak_kib": peak,
                      "seconds": seconds}))  # fmt: skip


def llama_config(args: argparse.Namespace, blocks: int, vocabulary: int, pad: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocabulary,
        hidden_size=args.d_model,
        intermediate_size=args.intermediate,
        num_hidden_layers=blocks,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=max(args.max_length, 128),
        tie_word_embeddings=True,
        pad_token_id=pad,
    )


def build_folder(args: argparse.Namespace, blocks: int, folder: Path) -> int:
    """Save a seeded random Llama model of ``blocks`` blocks to ``folder``; its float32 bytes."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from convergent.data import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())  # cached offline
    torch.manual_seed(args.seed)
    config = llama_config(args, blocks, len(tokenizer), tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    size = sum(parameter.numel() * 4 for parameter in model.parameters())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return size


def reference_bytes(args: argparse.Namespace) -> dict[str, int]:
    """What one block needs at once (see the module docstring), from the config."""
    d, inner = args.d_model, args.intermediate
    block_weights = 4 * d * d + 3 * d * inner + 2 * d  # q, k, v, o; gate, up, down; 2 norms
    # one Hessian per distinct input: q/k/v's, o's, gate/up's [d, d]; down's [inner, inner]
    hessians = 3 * d * d + inner * inner
    hidden = args.calibration_examples * args.max_length * d
    size = 8 if args.statistics == "float64" else 4
    return {
        "block weights (float32)": 4 * block_weights,
        f"Hessians ({args.statistics})": size * hessians,
        "calibration hidden states (float32)": 4 * hidden,
    }


def run_child(
    folder: Path, args: argparse.Namespace, save: Path | None, library: bool = False
) -> dict[str, Any]:
    prune_arguments = [
        str(folder), "--method", "sparsegpt", "--sparsity", "0.5",
        "--calibration-examples", str(args.calibration_examples),
        "--max-length", str(args.max_length), "--examples", str(args.examples),
        "--statistics", args.statistics,
    ]  # fmt: skip
    if save is not None:
        prune_arguments += ["--low-memory", "--save", str(save)]
    command = [sys.executable, __file__, "--library" if library else "--child", "--",
               *prune_arguments]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"the child process failed ({done.returncode}): {' '.join(command)}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["status"] != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"convergent prune exited with {result['status']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--blocks",
        type=int,
        nargs="*",
        default=[2, 4, 8],
        help="the streamed runs' block counts (default 2 4 8)",
    )
    parser.add_argument(
        "--in-memory-blocks",
        type=int,
        default=8,
        help="the block count of the in-memory run (default 8; 0: none)",
    )
    parser.add_argument("--d-model", type=int, default=1536)
    parser.add_argument("--intermediate", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--calibration-examples", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--examples", type=int, default=8, help="evaluation examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--statistics", choices=("float32", "float64"), default="float32",
        help="SparseGPT's statistics dtype, passed to prune (float32: the command's default);"
        " the reference counts the Hessians in it",
    )  # fmt: skip
    parser.add_argument(
        "--folder",
        type=Path,
        default=None,
        help="where the models are written (default: a temporary folder)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--library", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--with-library",
        action="store_true",
        help="beside the in-memory run, the library call it is held to (prune_one_shot on the"
        " loaded model, no evaluation)",
    )
    args, rest = parser.parse_known_args()
    if args.child or args.library:
        (library_child if args.library else child)([word for word in rest if word != "--"])
        return

    sizes = sorted(set(args.blocks) | ({args.in_memory_blocks} - {0}))
    with tempfile.TemporaryDirectory(dir=args.folder) as scratch:
        root = Path(scratch)
        rows = []
        reference = reference_bytes(args)
        total_reference = sum(reference.values())
        for blocks in sizes:
            folder = root / f"llama-{blocks}"
            weights = build_folder(args, blocks, folder)
            runs = []
            if blocks == args.in_memory_blocks:
                runs.append(("in memory", None))
                if args.with_library:
                    runs.append(("library call", None))
            if blocks in args.blocks:
                runs.append(("streamed", root / f"pruned-{blocks}"))
            for how, save in runs:
                result = run_child(folder, args, save, library=how == "library call")
                peak = (result["peak_kib"] - result["baseline_kib"]) * KIB
                rows.append({"blocks": blocks, "weights": weights, "how": how, "peak": peak,
                             "baseline": result["baseline_kib"] * KIB,
                             "seconds": result["seconds"]})  # fmt: skip
                print(f"{how}, {blocks} blocks ({weights / MIB:.0f} MiB of float32 weights):"
                      f" peak {peak / MIB:.0f} MiB above {result['baseline_kib'] / KIB:.0f} MiB"
                      f" after imports, {result['seconds']:.1f} s", flush=True)  # fmt: skip
                if save is not None:
                    subprocess.run(["rm", "-rf", str(save)], check=True)
            subprocess.run(["rm", "-rf", str(folder)], check=True)

    outside = 4 * (_vocabulary() * args.d_model + args.d_model)  # tied embedding, final norm
    print(f"\nmodel: Llama, d_model {args.d_model}, intermediate {args.intermediate},"
          f" {args.heads} heads, tied embeddings; SparseGPT 50 %, calibration"
          f" {args.calibration_examples} x {args.max_length} tokens, evaluation"
          f" {args.examples} examples; {os.cpu_count()} CPUs")  # fmt: skip
    for what, size in reference.items():
        print(f"  {what}: {size / MIB:.1f} MiB")
    print(f"  reference (their sum): {total_reference / MIB:.1f} MiB; outside the blocks"
          f" (embedding, final norm), not counted: {outside / MIB:.1f} MiB")  # fmt: skip
    print("\n| run | blocks | float32 weights | peak above imports | / reference"
          " | / (reference + outside) | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['how']} | {row['blocks']} | {row['weights'] / MIB:.0f} MiB"
              f" | {row['peak'] / MIB:.0f} MiB | {row['peak'] / total_reference:.2f}x"
              f" | {row['peak'] / (total_reference + outside):.2f}x"
              f" | {row['seconds']:.0f} |")  # fmt: skip
    streamed = [row for row in rows if row["how"] == "streamed"]
    if streamed:
        worst = max(row["peak"] / total_reference for row in streamed)
        print(f"\nstreamed peak / reference, largest: {worst:.2f}x (target <= 1.5x):"
              f" {'met' if worst <= 1.5 else 'not met'}")  # fmt: skip
        low, high = min(r["peak"] for r in streamed), max(r["peak"] for r in streamed)
        print(
            f"streamed peak, largest / smallest over {[r['blocks'] for r in streamed]} blocks:"
            f" {high / low:.3f} (target <= 1.10): {'met' if high <= 1.1 * low else 'not met'}"
        )


def _vocabulary() -> int:
    from transformers import AutoTokenizer

    from convergent.data import minilm_path

    return len(AutoTokenizer.from_pretrained(minilm_path()))


if __name__ == "__main__":
    main()
