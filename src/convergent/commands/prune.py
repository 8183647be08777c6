"""``convergent prune``: one-shot pruning (magnitude, Wanda, SparseGPT) of a trained run folder
or checkpoint, or of a Hugging Face model folder.

The run folder written by ``convergent train`` holds ``config.json`` and checkpoints; the
model is rebuilt from the config, its newest (or the named) checkpoint is loaded, and for
each sparsity a copy is pruned and evaluated on the validation split (loss, accuracy, and
perplexity for language models). Wanda and SparseGPT calibrate on a seeded sample of the
run's *training* split. With ``save_to``, the model pruned at the last sparsity is
written as a run folder (the run's ``config.json`` and ``checkpoints/``, so ``diagnose`` and
``prune`` take it) whose checkpoint state holds the masks (``{"masks": ..., "pruning": ...}``,
loadable with ``weights_only=True``), beside the report (``pruning.json``, ``pruning.md``,
``pruning.png``: the metric against sparsity and each matrix's sparsity); the masks can also
be rebuilt from its weights alone (``Masks.from_weights``). Its weights are compressed unless
``save.dense`` (:mod:`convergent.commands.pruned_folder`).

A Hugging Face ``save_pretrained`` folder is pruned by :func:`prune_hf_folder` instead: it is
evaluated on a named data source (perplexity for a causal LM, accuracy for a classifier),
calibrated on the train split of a named source (by default the same one),
and the pruned model is written beside a report (``pruning.json``, ``pruning.md``,
``pruning.png``): compressed (:func:`~convergent.commands.compressed.save_sparse`), or with
``save_pretrained`` when ``save.dense``.

Both take one :class:`~convergent.commands.prune_request.PruneRequest` (or its fields as
keywords, which build one): a compute ``device`` (blocks are calibrated, pruned and evaluated
there while the model stays in CPU memory), a ``dtype``, and so on. A Hugging Face folder that
would not fit in memory beside its working memory is streamed, one block in memory at a time
(:mod:`convergent.commands.prune_streamed`; the rule is
:func:`~convergent.commands.prune_memory.chooses_streaming`), or as ``low_memory`` says. An
N:M pattern fixes the sparsity (1 - N/M): one target, and a conflicting one is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from convergent.commands.hf_folders import (
    DEFAULT_DATA,
    evaluation_batch_size,
    evaluation_data,
    evaluation_summary,
)
from convergent.commands.hf_reading import load_hf_folder
from convergent.commands.prune_memory import chooses_streaming
from convergent.commands.prune_request import (
    CALIBRATION_BATCH_SIZE,
    DEFAULT_SPARSITIES,
    PruneRequest,
    refuse_hf_only,
    request_of,
    resolve_targets,
)
from convergent.commands.prune_streamed import prune_hf_folder_streamed
from convergent.commands.prune_sweep import hf_metrics_of, measured_sweep, metrics_of, report_writer
from convergent.commands.pruned_folder import save_pruned
from convergent.commands.pruning_report import headline_metric, write_pruning_report
from convergent.commands.runs import find_run_folder, load_run
from convergent.train import calibration_batches

__all__ = [
    "CALIBRATION_BATCH_SIZE",
    "DEFAULT_SPARSITIES",
    "PruneRequest",
    "prune_hf_folder",
    "prune_run",
    "resolve_targets",
]

logger = logging.getLogger(__name__)


def prune_run(
    path: str | Path,
    sparsities: tuple[float, ...] | None = None,
    *,
    request: PruneRequest | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Prune a trained run one-shot at each sparsity and evaluate it on validation data.

    Args:
        path: a run folder, its ``checkpoints`` folder or one checkpoint folder.
        sparsities: targets in [0, 1) (None: :data:`DEFAULT_SPARSITIES`; an N:M pattern
            prunes 1 - N/M, its one target).
        request: the whole request, instead of ``sparsities`` and ``options``.
        **options: :class:`~convergent.commands.prune_request.PruneRequest`'s fields (``spec``,
            ``method``, ``calibration_examples``, ``save_to``, ``save``, ``device``, ``dtype``,
            ``statistics``, ``progress``); the data options are a Hugging Face folder's only (a
            run calibrates on a seeded sample of its training split). ``save_to`` writes a run
            folder (``config.json`` and ``checkpoints/``) that ``diagnose`` and ``prune``
            accept, with the report.

    Returns:
        ``{"checkpoint", "task", "method", "spec", "calibration", "dense": metrics, "rows":
        [per sparsity: target, sparsity, model_sparsity, metrics], "layers", "excluded",
        "notes", "saved"}``; ``layers`` holds each pruned matrix at the last target.
    """
    request = request_of(sparsities, request, options)
    if Path(path).exists():  # a missing path gets load_run's own error
        refuse_hf_only(request.changed_hf_only(), path)
    run = load_run(path)
    model, splits, state, checkpoint = run.model, run.splits, run.state, run.checkpoint
    if request.dtype is not None:
        model.to(request.dtype)
    calibration = None
    if request.calibrates:
        examples = min(request.calibration_examples, len(splits.train))
        calibration = calibration_batches(splits.train, examples, request.calibration_batch_size)
    measure = metrics_of(splits.validation, splits.task, 256, request.compute, request.mask_spec)
    summary, report, pruned = measured_sweep(
        model, request, measure, calibration, "train split of the run's data"
    )
    summary = {
        "checkpoint": str(checkpoint),
        "task": splits.task,
        "metric": headline_metric(summary["dense"]),
        **summary,
    }
    if request.save_to is not None and report is not None:
        saved = save_pruned(
            Path(request.save_to), pruned, summary, write_pruning_report, request.save,
            run_config=run.config, step=int(state.get("step", 0)),
            config_text=(find_run_folder(run.checkpoint) / "config.json").read_text(),
            state={"masks": report.masks.state_dict(), "pruning": report.summary()},
        )  # fmt: skip
        logger.info("pruned checkpoint written to %s", saved)
    return summary


def prune_hf_folder(
    path: str | Path,
    sparsities: tuple[float, ...] | None = None,
    *,
    request: PruneRequest | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Prune a ``save_pretrained`` folder one-shot at each sparsity, evaluated before and after.

    A causal LM is scored by perplexity, exp(mean next-token cross-entropy), a sequence
    classifier by accuracy, both on the validation split of ``data`` tokenized with the
    folder's tokenizer (see :mod:`convergent.commands.hf_folders`). The folder is loaded
    whole, or streamed one block at a time when it would not fit in memory or ``low_memory``
    asks (:func:`~convergent.commands.prune_memory.chooses_streaming`).

    Args:
        path: the model folder.
        sparsities: targets in [0, 1) (None: :data:`DEFAULT_SPARSITIES`; an N:M pattern
            prunes 1 - N/M, its one target).
        request: the whole request, instead of ``sparsities`` and ``options``.
        **options: :class:`~convergent.commands.prune_request.PruneRequest`'s fields:
            ``data``, ``examples``, ``max_length``, ``seed``, ``spec``, ``method``,
            ``calibration_data``, ``calibration_examples``, ``save_to``, ``save``, ``device``,
            ``dtype``, ``low_memory``, ``statistics``, ``progress``.

    Returns:
        ``{"checkpoint", "kind", "architecture", "data", "examples", "task", "metric",
        "method", "spec", "calibration", "dense", "rows", "layers", "excluded", "notes",
        "saved"}``; ``layers`` holds each pruned matrix at the last target.
    """
    request = request_of(sparsities, request, options)
    if chooses_streaming(path, request):
        return prune_hf_folder_streamed(path, request)
    return prune_hf_folder_in_memory(path, request)


def prune_hf_folder_in_memory(path: str | Path, request: PruneRequest) -> dict[str, Any]:
    """:func:`prune_hf_folder` with the model loaded whole: each target but the last pruned on
    a copy, the last on the model itself."""
    loaded = load_hf_folder(path, request.dtype)
    data = request.data or DEFAULT_DATA[loaded.kind]
    max_length, seed = request.max_length, request.seed
    evaluation = evaluation_data(loaded, data, seed=seed, max_length=max_length,
                                 examples=request.examples)  # fmt: skip
    batch_size = evaluation_batch_size(loaded, max_length)
    calibration = None
    source_name = request.calibration_data or data
    if request.calibrates:
        source = evaluation_data(loaded, source_name, seed=seed, max_length=max_length,
                                 examples=request.calibration_examples, split="train")  # fmt: skip
        calibration = calibration_batches(
            source.dataset, len(source.dataset), request.calibration_batch_size, seed
        )
    measure = hf_metrics_of(loaded, evaluation, batch_size, request.compute, request.mask_spec)
    common, report, pruned = measured_sweep(
        loaded.model, request, measure, calibration, f"train split of {source_name}"
    )
    summary = {**evaluation_summary(path, loaded, evaluation, max_length, seed), **common}
    if request.save_to is not None and report is not None:
        save_pruned(Path(request.save_to), pruned, summary, report_writer(loaded),
                    request.save, tokenizer=loaded.tokenizer)  # fmt: skip
        logger.info("pruned model written to %s", request.save_to)
    return summary
