"""``convergent prune --low-memory``: prune a Hugging Face model folder one block in memory.

For a model larger than memory. Its weights stay in its safetensors files
(:class:`~convergent.models.streamed.StreamedModel`): the modules outside the Transformer
blocks are read once, and each block is read when it is calibrated and pruned, written to the
``--save`` folder as one shard, and dropped. The evaluation streams block by block too
(:func:`~convergent.train.evaluate_block_by_block`): the dense model from the folder's files,
the pruned one from the shards just written. The model is never whole in memory and never
copied. One target per call; the result is a sharded ``save_pretrained`` folder that
``from_pretrained`` loads.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from convergent.commands.hf_folders import (
    DEFAULT_DATA,
    HFFolderError,
    evaluation_batch_size,
    evaluation_data,
    load_hf_folder,
    quiet_progress,
)
from convergent.models.streamed import StreamedBlocks, weight_files
from convergent.sparse import MaskSpec, prune_one_shot
from convergent.sparse.blockwise import BLOCK_EXAMPLES
from convergent.sparse.calibration import find_blocks
from convergent.train import calibration_batches, evaluate_block_by_block

logger = logging.getLogger(__name__)


def prune_hf_folder_streamed(
    path: str | Path,
    sparsity: float,
    *,
    save_to: str | Path,
    data: str | None,
    examples: int | None,
    max_length: int,
    seed: int,
    spec: MaskSpec,
    method: str,
    calibration_data: str | None,
    calibration_examples: int,
    calibration_batch_size: int,
    device: str | torch.device | None,
    dtype: torch.dtype | None,
    progress: bool,
) -> tuple[dict[str, Any], Path]:
    """Prune the folder at ``path`` to ``sparsity``, streaming its blocks, into a staging
    folder beside ``save_to`` (the caller adds the report and moves it into place).
    ``device`` is checked by the caller (None: the CPU).

    Args:
        path: a ``save_pretrained`` folder with safetensors weights.
        sparsity: the one target.
        save_to: the folder the pruned model is for.
        data, examples, max_length, seed: the evaluation data (see
            :func:`~convergent.commands.prune.prune_hf_folder`).
        spec, method: the masks and the pruner.
        calibration_data, calibration_examples, calibration_batch_size: the calibration.
        device: where blocks are calibrated, pruned and evaluated (None: the CPU).
        dtype: the dtype to compute and save in (None: the folder's).
        progress: progress bars over the blocks.

    Returns:
        (the summary entries: dense and pruned metrics, the pruning report; the staging
        folder holding the pruned weights, config and tokenizer).
    """
    compute = torch.device(device or "cpu")
    loaded = load_hf_folder(path, dtype, streamed=True)
    streamed = loaded.streamed
    assert streamed is not None
    model = loaded.model
    names = spec.select(model).names
    found = find_blocks(model, names)
    if found is None:
        raise HFFolderError(
            f"--low-memory streams a model one Transformer block at a time, but found no block"
            f" list in {loaded.architecture} (looked for one such as {BLOCK_EXAMPLES})"
        )
    prefix = found[0]
    data = data or DEFAULT_DATA[loaded.kind]
    evaluation = evaluation_data(loaded, data, seed=seed, max_length=max_length, examples=examples)
    batch_size = evaluation_batch_size(loaded, max_length)
    calibration = None
    if method != "magnitude" or spec.distribution == "owl":
        source = evaluation_data(loaded, calibration_data or data, seed=seed,
                                 max_length=max_length, examples=calibration_examples,
                                 split="train")  # fmt: skip
        calibration = calibration_batches(
            source.dataset, len(source.dataset), calibration_batch_size, seed
        )
    streamed.load_outside(prefix)
    reading = StreamedBlocks(streamed, prefix)

    def measure(host: StreamedBlocks) -> dict[str, float]:
        return evaluate_block_by_block(
            model, prefix, evaluation.dataset, evaluation.task, batch_size, compute, host
        )

    dense = measure(reading)
    staging = Path(save_to).parent / f".{Path(save_to).name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        writing = StreamedBlocks(streamed, prefix, write_to=staging)
        report = prune_one_shot(model, sparsity, spec=spec, method=method,
                                calibration=calibration, device=compute, host=writing,
                                keep_masks=False, progress=progress)  # fmt: skip
        writing.finish()
        streamed.files = weight_files(staging)  # the pruned blocks, for the evaluation
        pruned = measure(reading)
        with quiet_progress():
            model.config.save_pretrained(staging)
            loaded.tokenizer.save_pretrained(staging)
            generation = getattr(model, "generation_config", None)
            if generation is not None and (Path(path) / "generation_config.json").is_file():
                generation.save_pretrained(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary = {
        "kind": loaded.kind,
        "architecture": loaded.architecture,
        "data": evaluation.data,
        "examples": len(evaluation.dataset),
        "task": evaluation.task,
        "dense": dense,
        "rows": [{"target": sparsity, "sparsity": report.sparsity, **pruned}],
        "report": report,
        "calibration_examples": 0 if calibration is None else len(source.dataset),
        "dtype": streamed.dtype,
    }
    logger.info("pruned %s block by block (%s), written to %s", path, prefix, save_to)
    return summary, staging
