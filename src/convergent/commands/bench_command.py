"""``convergent bench`` on the command line: its flags, and the figures of
:func:`~convergent.commands.benchmark.bench` printed (and written as JSON when asked)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``bench`` and its flags to ``commands``."""
    from convergent.commands.benchmark import DEVICES, LENGTHS

    parser = commands.add_parser(
        "bench",
        help="forward speed, file size and peak memory of a model, dense against sparse kernels",
        description="Time a [1, T] forward pass (no KV cache) dense and through sparse kernels"
        " (each pruned layer on the faster of the two, timed at T tokens), compare the weights'"
        " size dense and compressed, and measure peak memory in one fresh process per variant.",
    )
    parser.add_argument(
        "path",
        type=Path,
        help="a run folder, its checkpoints folder, a checkpoint, or a save_pretrained folder"
        " (compressed or not)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="the torch threads every variant is timed with (default: torch's own setting)",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the dense and sparse forwards are timed (default cpu)",
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=list(LENGTHS),
        metavar="T",
        help=f"tokens per forward (default {' '.join(map(str, LENGTHS))})",
    )
    parser.add_argument(
        "--generate",
        type=int,
        default=None,
        metavar="N",
        help="also time model.generate of N new tokens (greedy, KV cache, batch 1) dense"
        " against sparse kernels chosen at one token, with the weights read per token",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    """``convergent bench``'s parsed flags: do the command; returns the exit status."""
    from convergent.commands.benchmark import bench, format_bench
    from convergent.io import write_text_atomically

    result = bench(
        arguments.path,
        threads=arguments.threads,
        device=arguments.device,
        lengths=arguments.lengths,
        memory=not arguments.no_memory,
        generate=arguments.generate,
    )
    if arguments.json is not None:
        write_text_atomically(arguments.json, json.dumps(result, indent=2) + "\n")
    print(format_bench(result), end="")
    return 0
