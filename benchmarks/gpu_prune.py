"""SparseGPT 50 % of a 1B-parameter Llama-style model on one GPU: peak GPU memory against one
block's floor, and time per block.

The model is built from a config (TinyLlama-1.1B's shape by default: d_model 2048,
intermediate 5632, 22 blocks, 32 heads, 4 key-value heads, vocabulary 32,000) in bfloat16,
random and seeded (this measures memory and time, not quality), and stays in CPU memory;
``prune_one_shot(..., device="cuda")`` brings each block to the GPU with the calibration
hidden states, gathers its Hessians, prunes it and sends it home, as ``convergent prune
--device cuda`` does. Calibration: ``--calibration-examples`` random token windows of
``--max-length`` tokens.

Reported: ``torch.cuda.max_memory_allocated`` over the whole call, against one block's floor
computed from the config (the block's bfloat16 weights, its Hessians in the statistics dtype,
one per distinct input as the driver holds them, and the calibration hidden states in
bfloat16); and the seconds each block spent on the GPU (from entering to leaving), with the
mean and the slowest.

    python benchmarks/gpu_prune.py                          # on a machine with CUDA
    python benchmarks/gpu_prune.py --device cpu --blocks 2 --d-model 256 --intermediate 704 \\
        --heads 4 --kv-heads 2 --vocabulary 1024 --calibration-examples 4   # a CPU dry run
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

GIB = 2**30
MIB = 2**20


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--blocks", type=int, default=22)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--calibration-examples", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--statistics", choices=("float32", "float64"), default="float64")
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.d_model % args.heads or args.heads % args.kv_heads:
        parser.error(
            f"--d-model {args.d_model} must divide by --heads {args.heads}, and --heads by"
            f" --kv-heads {args.kv_heads}"
        )
    return args


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocabulary, hidden_size=args.d_model,
                         intermediate_size=args.intermediate, num_hidden_layers=args.blocks,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=max(args.max_length, 128),
                         tie_word_embeddings=False)  # fmt: skip
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def block_floor(args: argparse.Namespace) -> dict[str, int]:
    """What one block needs on the device at once, in bytes, from the config."""
    d, inner, kv = args.d_model, args.intermediate, args.d_model * args.kv_heads // args.heads
    weights = 2 * d * d + 2 * d * kv + 3 * d * inner + 2 * d  # q, o; k, v; gate, up, down; norms
    statistic = 8 if args.statistics == "float64" else 4
    hessians = 3 * d * d + inner * inner  # q/k/v's, o's, gate/up's [d, d]; down's [inner, inner]
    hidden = args.calibration_examples * args.max_length * d
    return {
        "block weights (bfloat16)": 2 * weights,
        f"Hessians ({args.statistics})": statistic * hessians,
        "calibration hidden states (bfloat16)": 2 * hidden,
    }


class TimedBlocks:
    """The in-memory host, timing each block from entering the device to leaving it."""

    def __init__(self, device: torch.device) -> None:
        from convergent.models.placement import InMemoryBlocks

        self.host = InMemoryBlocks()
        self.device = device
        self.started: dict[int, float] = {}
        self.seconds: dict[int, float] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def enter(self, index: int, block: Any, device: torch.device) -> None:
        self._sync()
        self.started[index] = time.perf_counter()
        self.host.enter(index, block, device)

    def leave(self, index: int, block: Any, pruned: bool) -> None:
        self.host.leave(index, block, pruned)
        self._sync()
        if pruned:  # the pruning pass (OWL's dense pass would not be)
            self.seconds[index] = time.perf_counter() - self.started.pop(index)

    def outside(self, model: Any, prefix: str, device: torch.device) -> Any:
        return self.host.outside(model, prefix, device)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_arguments(argv)
    from convergent.models.placement import check_device
    from convergent.sparse import prune_one_shot

    device = check_device(args.device, torch.bfloat16)
    model = build_model(args)
    parameters = sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocabulary, (args.calibration_examples, args.max_length),
                        generator=generator)  # fmt: skip
    batches = [{"input_ids": ids[i : i + 8]} for i in range(0, len(ids), 8)]
    host = TimedBlocks(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    report = prune_one_shot(model, args.sparsity, method="sparsegpt", calibration=batches,
                            device=device, host=host, keep_masks=False,
                            options={"statistics": args.statistics})  # fmt: skip
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    floor = block_floor(args)
    result = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "parameters": parameters,
        "sparsity": report.sparsity,
        "seconds": seconds,
        "block_seconds": [host.seconds[i] for i in sorted(host.seconds)],
        "peak_bytes": peak,
        "floor": floor,
        "statistics": args.statistics,
    }
    print(f"Llama-style, {parameters / 1e9:.2f} B parameters in bfloat16 ({args.blocks} blocks,"
          f" d_model {args.d_model}), SparseGPT {args.sparsity:g} on {device}"
          f" ({result['gpu'] or 'no GPU'}), statistics {args.statistics}, calibration"
          f" {args.calibration_examples} x {args.max_length} tokens")  # fmt: skip
    for what, size in floor.items():
        print(f"  {what}: {size / MIB:.1f} MiB")
    total = sum(floor.values())
    print(f"  one block's floor: {total / MIB:.1f} MiB")
    if peak is not None:
        print(f"peak GPU memory: {peak / MIB:.1f} MiB = {peak / total:.2f}x the floor")
    times = result["block_seconds"]
    if times:
        print(f"time per block: mean {sum(times) / len(times):.2f} s, slowest {max(times):.2f} s;"
              f" whole call {seconds:.1f} s; pruned layers' sparsity {report.sparsity:.4f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
