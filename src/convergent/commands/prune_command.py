"""``convergent prune`` on the command line: its flags, checked against the kind of folder
pruned (a run brings its own data; only a Hugging Face folder takes the data options), and
the sweep's summary printed. The pruning itself is :mod:`convergent.commands.prune`'s."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from convergent.commands.flags import (
    UserError,
    add_mask_spec_arguments,
    mask_spec_from_arguments,
)

# The command's statistics dtype when --statistics is not given. The library's default (and
# PruneRequest's) stays float64, which the studies' units were computed with; on the trained
# GPT-2 and Llama of benchmarks/llmcompressor_compare.py float32 moved SparseGPT's perplexity by
# at most 0.003 % and Wanda's masks not at all (benchmarks/README.md, "Statistics in float32 or
# float64"), and it is what the SparseGPT authors' code and llm-compressor compute in.
COMMAND_STATISTICS = "float32"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``prune`` and its flags to ``commands``."""
    from convergent.commands.prune_request import DEFAULT_SPARSITIES, request_default
    from convergent.sparse import METHODS
    from convergent.sparse.spec import STATISTICS_DTYPES

    parser = commands.add_parser(
        "prune",
        help="one-shot pruning (magnitude, Wanda, SparseGPT) of a trained run or a Hugging Face"
        " model folder",
        description="Prune a run folder (or checkpoint) written by 'convergent train', or a"
        " Hugging Face save_pretrained folder (a causal LM or a sequence classifier), one-shot"
        " by weight magnitude, Wanda or SparseGPT, and report validation"
        " loss/accuracy/perplexity at each sparsity.",
    )
    parser.add_argument(
        "path",
        type=Path,
        help="a run folder, its checkpoints folder, a checkpoint, or a save_pretrained folder",
    )
    parser.add_argument(
        "--sparsity",
        type=float,
        action="append",
        help="target in [0, 1); repeat for several (default "
        f"{' '.join(map(str, DEFAULT_SPARSITIES))}; N:M patterns prune 1 - N/M)",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="magnitude",
        help="magnitude (no data), or wanda / sparsegpt, calibrated block by block",
    )
    placement = parser.add_argument_group("where and how the model is pruned")
    placement.add_argument(
        "--device",
        default=None,
        help="where each block is calibrated, pruned and evaluated: cpu, cuda or cuda:N (the"
        " model stays in CPU memory; default: where it loads, the CPU)",
    )
    placement.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="load, prune and save the model in this dtype; the statistics are in --statistics's"
        " dtype whatever it is (default: the checkpoint's own)",
    )
    placement.add_argument(
        "--low-memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a Hugging Face folder: stream its blocks from its safetensors files, one in memory"
        " at a time, writing each pruned block to --save (one --sparsity per call);"
        " --no-low-memory loads it whole (default: streamed when loading it whole would not"
        " fit in the memory available, which is logged)",
    )
    calibration = parser.add_argument_group("Wanda and SparseGPT calibration")
    calibration.add_argument(
        "--statistics",
        choices=tuple(STATISTICS_DTYPES),
        default=COMMAND_STATISTICS,
        help="the dtype the calibration statistics (SparseGPT's Hessian and its Cholesky"
        " factors, Wanda's input norms) are gathered and factorized in (default"
        f" {COMMAND_STATISTICS}, as the SparseGPT authors' code and llm-compressor compute"
        f" them; the library's default is {request_default('statistics')}: benchmarks/README.md"
        " has the measurements behind both)",
    )
    calibration.add_argument(
        "--calibration-data",
        default=None,
        help="the source whose train split they calibrate on (default: --data's; a run uses its"
        " own training split)",
    )
    calibration.add_argument(
        "--calibration-examples",
        type=int,
        default=None,
        help=f"training examples to calibrate on (default "
        f"{request_default('calibration_examples')})",
    )
    calibration.add_argument(
        "--calibration-batch-size",
        type=int,
        default=None,
        help="calibration examples run through a block at once; fewer hold less activation"
        f" memory (default {request_default('calibration_batch_size')})",
    )
    add_mask_spec_arguments(
        parser.add_argument_group("which weights, and the masks' layout"), one_shot=True
    )
    parser.add_argument(
        "--save",
        type=Path,
        default=None,
        help="write the model pruned at the last sparsity into this new folder, its weights"
        " compressed (load it with convergent.commands.load_sparse), with pruning.json,"
        " pruning.md (sizes, and bench's speed and memory) and pruning.png",
    )
    parser.add_argument(
        "--dense",
        action="store_true",
        help="with --save: write ordinary weights (model.safetensors) that other tools read",
    )
    parser.add_argument(
        "--no-bench",
        action="store_true",
        help="with --save: leave bench's speed and memory figures out of pruning.md",
    )
    hugging_face = parser.add_argument_group("Hugging Face model folders only")
    hugging_face.add_argument(
        "--data",
        default=None,
        help="the data to evaluate on (default austen for a causal LM, rt-sentences for a"
        " classifier; also hf:NAME)",
    )
    hugging_face.add_argument(
        "--examples",
        type=int,
        default=None,
        help="evaluate on the first this many validation examples (default: all)",
    )
    hugging_face.add_argument(
        "--max-length",
        type=int,
        default=None,
        help=f"tokens per example (default {request_default('max_length')})",
    )
    hugging_face.add_argument(
        "--seed",
        type=int,
        default=None,
        help=f"seeds the data's split into train, validation and test (default {request_default('seed')})",
    )
    parser.set_defaults(handler=run)


# Request fields that are not a flag of their own name: built from the flags below.
BUILT_FIELDS = ("sparsities", "spec", "dtype", "save_to", "save", "progress")


def request_from_arguments(arguments: argparse.Namespace) -> Any:
    """The :class:`~convergent.commands.prune_request.PruneRequest` of ``prune``'s flags: each
    field whose flag was given (``--calibration-examples`` sets ``calibration_examples``), the
    request's own defaults for the others (checked as it is built)."""
    import dataclasses

    import torch

    from convergent.commands.prune_request import PruneRequest
    from convergent.commands.pruned_folder import SaveOptions

    if (arguments.dense or arguments.no_bench) and arguments.save is None:
        raise UserError("--dense and --no-bench apply to --save FOLDER only; add --save")
    given = {
        item.name: getattr(arguments, item.name)
        for item in dataclasses.fields(PruneRequest)
        if item.init
        and item.name not in BUILT_FIELDS
        and getattr(arguments, item.name, None) is not None
    }
    return PruneRequest(
        sparsities=tuple(arguments.sparsity) if arguments.sparsity else None,
        spec=mask_spec_from_arguments(arguments),
        dtype=None if arguments.dtype is None else getattr(torch, arguments.dtype),
        save_to=arguments.save,
        save=SaveOptions(dense=arguments.dense, bench=not arguments.no_bench),
        progress=True,
        **given,
    )


def run(arguments: argparse.Namespace) -> int:
    """``convergent prune``'s parsed flags: do the command; returns the exit status."""
    from convergent.commands.hf_reading import HUGGING_FACE, folder_kind
    from convergent.commands.prune import prune_hf_folder, prune_run
    from convergent.commands.prune_request import HF_ONLY, refuse_hf_only
    from convergent.commands.pruning_report import format_prune_summary

    hugging_face = folder_kind(arguments.path) == HUGGING_FACE
    if not hugging_face and arguments.path.exists():  # a missing path gets its own error
        refuse_hf_only([name for name in HF_ONLY if getattr(arguments, name) is not None],
                       arguments.path)  # fmt: skip
    request = request_from_arguments(arguments)
    prune = prune_hf_folder if hugging_face else prune_run
    print(format_prune_summary(prune(arguments.path, request=request)))
    return 0
