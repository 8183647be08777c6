"""``convergent prune --low-memory``: prune a Hugging Face model folder one block in memory.

For a model larger than memory. Its weights stay in its safetensors files
(:class:`~convergent.models.streamed.StreamedModel`): the modules outside the Transformer
blocks are read for each pass that runs them (before the first block, after the last) and
dropped after, unless pruning changes one of them (then they stay until written); each block
is read when it is calibrated and pruned, written to the ``--save`` folder as one shard
(compressed, as ``prune --save`` writes, or ordinary with ``--dense``), and dropped. The evaluation streams block by block too
(:func:`~convergent.train.evaluate_block_by_block`): the dense model from the folder's files,
the pruned one from the shards just written. The model is never whole in memory and never
copied. One target per call. ``convergent bench`` (which loads the whole model) is not run.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from convergent.commands.compressed import check_save_folder, write_config_files
from convergent.commands.hf_folders import (
    DEFAULT_DATA,
    evaluation_batch_size,
    evaluation_data,
    evaluation_summary,
)
from convergent.commands.hf_reading import HFFolderError, load_hf_folder, quiet_progress
from convergent.commands.prune_request import (
    PruneRequest,
    check_streamable,
)
from convergent.commands.pruned_folder import NOT_BENCHED_STREAMED, size_summary
from convergent.commands.pruning_report import write_pruning_report
from convergent.commands.sentence_embeddings import SENTENCE_EMBEDDING
from convergent.models.streamed import (
    DenseShards,
    SafetensorsReader,
    StreamedBlocks,
    map_large_allocations,
    release_freed_memory,
)
from convergent.sparse import PruningReport, prune_one_shot
from convergent.sparse.blockwise import BLOCK_EXAMPLES
from convergent.sparse.calibration import find_blocks
from convergent.sparse.storage import (
    COMPRESSED_INDEX,
    CompressedReader,
    CompressedShards,
    group_dims,
)
from convergent.train import calibration_batches, evaluate_block_by_block
from convergent.wording import option

logger = logging.getLogger(__name__)


def prune_hf_folder_streamed(path: str | Path, request: PruneRequest) -> dict[str, Any]:
    """Prune the folder at ``path`` to ``request``'s one target, streaming its blocks into its
    ``save_to`` folder (``request.compute`` None is the CPU; ``save.dense`` writes ordinary
    shards).

    Returns:
        The summary, as :func:`~convergent.commands.prune.prune_hf_folder` returns it, with
        ``low_memory`` set.
    """
    check_streamable(request)
    map_large_allocations()  # freed blocks go back to the system, not to glibc's heaps
    save_to = Path(str(request.save_to))
    spec, method = request.mask_spec, request.method
    seed, max_length = request.seed, request.max_length
    compute = request.compute or torch.device("cpu")
    loaded = load_hf_folder(path, request.dtype, streamed=True)
    streamed = loaded.streamed
    assert streamed is not None
    model = loaded.model
    if loaded.kind == SENTENCE_EMBEDDING:
        raise HFFolderError(
            f"{option('low_memory')} scores a model by its task block by block; a sentence"
            f" encoder's embeddings are scored in memory: leave out {option('low_memory')}"
        )
    selected = spec.select(model).names
    found = find_blocks(model, selected)
    if found is None:
        raise HFFolderError(
            f"{option('low_memory')} streams a model one Transformer block at a time, but found"
            f" no block list in {loaded.architecture} (looked for one such as {BLOCK_EXAMPLES})"
        )
    prefix = found[0]
    data = request.data or DEFAULT_DATA[loaded.kind]
    evaluation = evaluation_data(loaded, data, seed=seed, max_length=max_length,
                                 examples=request.examples)  # fmt: skip
    batch_size = evaluation_batch_size(loaded, max_length)
    calibration, calibrated = None, None
    source_name = request.calibration_data or data
    if request.calibrates:
        source = evaluation_data(loaded, source_name, seed=seed, max_length=max_length,
                                 examples=request.calibration_examples, split="train")  # fmt: skip
        calibration = calibration_batches(
            source.dataset, len(source.dataset), request.calibration_batch_size, seed
        )
        calibrated = {
            "data": f"train split of {source_name}",
            "examples": len(source.dataset),
            "method": method,
        }
    release_freed_memory()  # what reading and tokenizing the data left in glibc's heaps
    if any(not name.startswith(f"{prefix}.") for name in selected):
        # pruned in memory, so held from the first pass until written (the last shard)
        streamed.load_outside(prefix)
    # else each pass reads the modules outside the blocks when it runs them, and drops them
    reading = StreamedBlocks(streamed, prefix)

    def measure() -> dict[str, float]:
        return evaluate_block_by_block(
            model, prefix, evaluation.dataset, evaluation.task, batch_size, compute, reading
        )

    dense_metrics = measure()
    staging = Path(save_to).parent / f".{Path(save_to).name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        dense = request.save_options.dense
        writer = DenseShards(staging) if dense else CompressedShards(staging, group_dims(model))
        writing = StreamedBlocks(streamed, prefix, writer)
        report = prune_one_shot(model, request.targets[0], spec=spec, method=method,
                                calibration=calibration, options=request.pruner_options,
                                device=compute, host=writing, keep_masks=False,
                                progress=request.progress)  # fmt: skip
        writing.finish()
        # the evaluation reads the pruned blocks from the shards just written
        streamed.reader = SafetensorsReader(staging) if dense else CompressedReader(staging)
        pruned = measure()
        write_config_files(staging, model, None if dense else COMPRESSED_INDEX)
        with quiet_progress():
            loaded.tokenizer.save_pretrained(staging)
        summary = _summary(path, loaded, evaluation, report, dense_metrics, pruned, max_length,
                           seed, calibrated, compute, streamed.dtype)  # fmt: skip
        summary["sizes"] = size_summary(staging, model, [row["name"] for row in report.layers])
        summary["saved"] = str(save_to)
        summary["bench_skipped"] = NOT_BENCHED_STREAMED
        write_pruning_report(staging, summary)
        check_save_folder(save_to)
        if Path(save_to).exists():
            Path(save_to).rmdir()  # empty, checked above; os.replace cannot replace a folder
        os.replace(staging, save_to)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("pruned %s block by block (%s), written to %s", path, prefix, save_to)
    return summary


def _summary(
    path: str | Path,
    loaded: Any,
    evaluation: Any,
    report: PruningReport,
    dense: dict[str, float],
    pruned: dict[str, float],
    max_length: int,
    seed: int,
    calibrated: dict[str, Any] | None,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """The summary entries of :func:`~convergent.commands.prune.prune_hf_folder`."""
    return {
        **evaluation_summary(path, loaded, evaluation, max_length, seed),
        "method": report.method,
        "spec": report.spec.as_dict(),
        "calibration": calibrated,
        "dense": dense,
        "rows": [
            {
                "target": report.target,
                "sparsity": report.sparsity,
                "model_sparsity": report.pruned / max(report.total, 1),
                **pruned,
                "caveats": report.caveats,
            }
        ],
        "layers": report.layers,
        "block_sparsities": report.summary()["block_sparsities"],
        "options": report.options,
        "excluded": report.excluded,
        "notes": report.notes,
        "caveats": report.caveats,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "low_memory": True,
    }
