"""The sweep of one-shot pruning over its targets, and what it measures and writes.

:func:`sweep` prunes a model at each target (a copy for every target but the last, the model
itself at the last); :func:`measured_sweep` adds the dense metrics and the summary entries both
prune paths share; :func:`metrics_of` and :func:`hf_metrics_of` score a model (in place, one block at
a time on a compute device, or a sentence encoder's embedding fidelity); :func:`report_writer`
writes a Hugging Face folder's report beside its pruned weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from convergent.commands.prune_request import PruneRequest
from convergent.commands.pruning_report import write_pruning_report
from convergent.commands.sentence_embeddings import (
    SENTENCE_EMBEDDING,
    copy_sentence_transformers_files,
    embedding_fidelity,
    pooling_mode,
)
from convergent.models.placement import home_device
from convergent.sparse import MaskSpec, PruningReport, prune_one_shot
from convergent.sparse.blockwise import BLOCK_EXAMPLES
from convergent.sparse.calibration import find_blocks
from convergent.train import evaluate, evaluate_block_by_block
from convergent.wording import option

ModelT = TypeVar("ModelT", bound=nn.Module)


def sweep(
    model: ModelT,
    sparsities: tuple[float, ...],
    measure: Callable[[ModelT], dict[str, float]],
    **options: Any,
) -> tuple[list[dict[str, Any]], PruningReport | None, ModelT]:
    """Prune ``model`` one-shot at each target and measure it: a copy for every target but the
    last, and ``model`` itself, in place, for the last (so memory never holds more than the
    model and one copy, and a single target no copy at all).

    Args:
        model: the dense model (pruned in place at the last target).
        sparsities: the targets, in order.
        measure: the metrics of a model, e.g. validation loss and accuracy.
        **options: :func:`~convergent.sparse.prune_one_shot`'s selection options.

    Returns:
        (one row per target: target, sparsity reached, metrics; the last target's report;
        the model pruned at the last target, or ``model`` when there is none).
    """
    rows: list[dict[str, Any]] = []
    report, pruned = None, model
    for index, target in enumerate(sparsities):
        pruned = model  # the previous target's copy is freed before the next is made
        if index < len(sparsities) - 1:
            pruned = copy.deepcopy(model)
        report = prune_one_shot(pruned, target, **options)
        rows.append(
            {
                "target": target,
                "sparsity": report.sparsity,
                "model_sparsity": report.pruned / max(report.total, 1),
                **measure(pruned),
                "caveats": report.caveats,
            }
        )
    return rows, report, pruned


def measured_sweep(
    model: ModelT,
    request: PruneRequest,
    measure: Callable[[ModelT], dict[str, float]],
    calibration: list[dict[str, Any]] | None,
    calibration_source: str,
) -> tuple[dict[str, Any], PruningReport | None, ModelT]:
    """The dense metrics and :func:`sweep` over ``request``'s targets, as the summary entries
    both in-memory paths share (a run's and a Hugging Face folder's)."""
    dense = measure(model)
    spec, method, device = request.mask_spec, request.method, request.compute
    rows, report, pruned = sweep(
        model,
        request.targets,
        measure,
        spec=spec,
        method=method,
        calibration=calibration,
        progress=request.progress,
        device=device,
        options=request.pruner_options,
    )
    summary = {
        "method": method,
        "spec": spec.as_dict(),
        "calibration": calibration_entry(method, calibration_source, calibration),
        "dense": dense,
        "rows": rows,
        "layers": report.layers if report else [],
        "block_sparsities": report.summary()["block_sparsities"] if report else {},
        "options": report.options if report else {},
        "excluded": report.excluded if report else {},
        "notes": report.notes if report else [],
        "caveats": [caveat for row in rows for caveat in row["caveats"]],
        "device": str(device or home_device(model)),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "saved": None,
    }
    return summary, report, pruned


def metrics_of(
    dataset: Any, task: str, batch_size: int, device: torch.device | None, spec: MaskSpec
) -> Callable[[nn.Module], dict[str, float]]:
    """The metrics of a model on ``dataset``: in place, or, with a compute ``device`` other
    than the model's, one block at a time on it (the model stays where it is)."""

    def metrics(model: nn.Module) -> dict[str, float]:
        if device is None or device == home_device(model):
            return evaluate(model, dataset, task, batch_size=batch_size)
        found = find_blocks(model, spec.select(model).names)
        if found is None:
            raise ValueError(
                f"evaluating on {device} moves one Transformer block at a time, but the model"
                f" has no block list (looked for one such as {BLOCK_EXAMPLES})"
            )
        return evaluate_block_by_block(model, found[0], dataset, task, batch_size, device)

    return metrics


def hf_metrics_of(
    loaded: Any, evaluation: Any, batch_size: int, device: torch.device | None, spec: MaskSpec
) -> Callable[[nn.Module], dict[str, float]]:
    """The metrics of a Hugging Face folder's model: its task's, or for a sentence encoder the
    fidelity of its embeddings to the dense model's
    (:mod:`convergent.commands.sentence_embeddings`), scored in memory on its own device."""
    if loaded.kind != SENTENCE_EMBEDDING:
        return metrics_of(evaluation.dataset, evaluation.task, batch_size, device, spec)
    if device is not None and device != home_device(loaded.model):
        raise ValueError(
            f"a sentence encoder is scored in memory where it is loaded, on the CPU; leave out"
            f" {option('device', str(device))}"
        )
    return embedding_fidelity(evaluation.dataset, pooling_mode(loaded.path), batch_size)


def report_writer(loaded: Any) -> Callable[[Path, dict[str, Any]], None]:
    """Writes the report into the staging folder, and for a sentence encoder the folder's
    sentence-transformers files beside it (so the pruned folder loads as the original did)."""

    def write(staging: Path, summary: dict[str, Any]) -> None:
        if loaded.kind == SENTENCE_EMBEDDING:
            copy_sentence_transformers_files(loaded.path, staging)
        write_pruning_report(staging, summary)

    return write


def calibration_entry(
    method: str, source: str, batches: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """The summary's ``calibration`` entry: the data, how many examples, the method (None
    when nothing was calibrated)."""
    if batches is None:
        return None
    examples = sum(len(next(iter(batch.values()))) for batch in batches)
    return {"data": source, "examples": examples, "method": method}
