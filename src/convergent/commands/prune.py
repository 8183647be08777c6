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

Both take a compute ``device`` (blocks are calibrated, pruned and evaluated there while the model
stays in CPU memory) and a ``dtype``; a folder too large for memory is pruned with
``low_memory`` (:mod:`convergent.commands.prune_streamed`). An N:M pattern fixes the sparsity
(1 - N/M): one target, and a conflicting one is refused.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from convergent.commands.compressed import check_save_folder
from convergent.commands.hf_folders import (
    DEFAULT_DATA,
    evaluation_batch_size,
    evaluation_data,
    evaluation_summary,
    load_hf_folder,
)
from convergent.commands.prune_streamed import prune_hf_folder_streamed
from convergent.commands.pruned_folder import SaveOptions, save_pruned
from convergent.commands.pruning_report import (
    headline_metric,
    write_pruning_report,
)
from convergent.commands.runs import find_run_folder, load_run
from convergent.commands.sentence_embeddings import (
    SENTENCE_EMBEDDING,
    copy_sentence_transformers_files,
    embedding_fidelity,
    pooling_mode,
)
from convergent.models.placement import check_device, home_device
from convergent.sparse import MaskSpec, PruningReport, prune_one_shot
from convergent.sparse.blockwise import BLOCK_EXAMPLES
from convergent.sparse.calibration import find_blocks
from convergent.sparse.masks import check_sparsity
from convergent.sparse.oneshot import check_one_shot
from convergent.sparse.spec import check_statistics
from convergent.train import calibration_batches, evaluate, evaluate_block_by_block
from convergent.wording import option

logger = logging.getLogger(__name__)


ModelT = TypeVar("ModelT", bound=nn.Module)

DEFAULT_SPARSITIES = (0.5, 0.7, 0.9)
CALIBRATION_BATCH_SIZE = 16


def resolve_targets(sparsities: tuple[float, ...] | None, spec: MaskSpec) -> tuple[float, ...]:
    """The targets to prune to: ``sparsities`` (None: :data:`DEFAULT_SPARSITIES`), or for an
    N:M pattern its one sparsity 1 - N/M, which a conflicting target may not contradict."""
    if spec.n_m is None:
        targets = tuple(sparsities) if sparsities else DEFAULT_SPARSITIES
        for target in targets:
            check_sparsity(target)
        return targets
    n, m = spec.n_m
    implied = 1 - n / m
    conflicting = [t for t in sparsities or () if not math.isclose(t, implied, abs_tol=1e-9)]
    if conflicting:
        raise ValueError(
            f"{option('pattern', spec.pattern)} prunes 1 - N/M = {implied:g} of every layer, so"
            f" {option('sparsity')} must be {implied:g} or left out, got {conflicting[0]:g}"
        )
    return (implied,)


def pruner_options_for(method: str, statistics: str) -> dict[str, Any] | None:
    """The pruner options the commands pass: the statistics' dtype, for the calibrated
    methods (magnitude gathers none)."""
    check_statistics(statistics)
    return None if method == "magnitude" else {"statistics": statistics}


def check_calibration_examples(calibration_examples: int) -> None:
    """Refuse a calibration sample of fewer than one example, naming its own option."""
    if calibration_examples < 1:
        raise ValueError(
            f"{option('calibration_examples', calibration_examples)} is out of range; it must"
            " be >= 1."
        )


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


def prune_run(
    path: str | Path,
    sparsities: tuple[float, ...] | None = None,
    *,
    spec: MaskSpec | None = None,
    method: str = "magnitude",
    calibration_examples: int = 128,
    save_to: str | Path | None = None,
    save: SaveOptions | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    statistics: str = "float64",
    progress: bool = False,
) -> dict[str, Any]:
    """Prune a trained run one-shot at each sparsity and evaluate it on validation data.

    Args:
        path: a run folder, its ``checkpoints`` folder or one checkpoint folder.
        sparsities: targets in [0, 1) (None: :data:`DEFAULT_SPARSITIES`; an N:M pattern
            prunes 1 - N/M, its one target).
        spec: which weights, the distribution and the pattern; None is ``MaskSpec()``.
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        calibration_examples: examples of the run's training split that Wanda and SparseGPT
            (and OWL) calibrate on (a seeded sample; unused by magnitude alone).
        save_to: write the model pruned at the last sparsity here, as a run folder
            (``config.json`` and ``checkpoints/``) that ``diagnose`` and ``prune`` accept,
            with its report (``pruning.json``, ``pruning.md``, ``pruning.png``).
        save: how ``save_to`` is written (compressed by default; :class:`SaveOptions`).
        device: where blocks are calibrated, pruned and evaluated (None: the model's device).
        dtype: the dtype to prune and save in (None: the checkpoint's).
        statistics: the dtype Wanda's and SparseGPT's calibration statistics are gathered
            and factorized in, ``"float64"`` or ``"float32"``.
        progress: progress bars over the blocks.

    Returns:
        ``{"checkpoint", "task", "method", "spec", "calibration", "dense": metrics, "rows":
        [per sparsity: target, sparsity, model_sparsity, metrics], "layers", "excluded",
        "notes", "saved"}``; ``layers`` holds each pruned matrix at the last target.
    """
    spec = MaskSpec.given(spec)
    sparsities = resolve_targets(sparsities, spec)
    options = pruner_options_for(method, statistics)
    check_one_shot(method, spec, options)
    check_calibration_examples(calibration_examples)
    compute = check_device(device, dtype)
    if save_to is not None:
        check_save_folder(save_to)
    run = load_run(path)
    model, splits, state, checkpoint = run.model, run.splits, run.state, run.checkpoint
    if dtype is not None:
        model.to(dtype)
    calibration = None
    if method != "magnitude" or spec.distribution == "owl":
        calibration = calibration_batches(
            splits.train, min(calibration_examples, len(splits.train)), CALIBRATION_BATCH_SIZE
        )
    summary, report, pruned = _measured_sweep(
        model,
        sparsities,
        _measure(splits.validation, splits.task, 256, compute, spec),
        spec,
        method,
        calibration,
        "train split of the run's data",
        progress,
        compute,
        options,
    )
    summary = {
        "checkpoint": str(checkpoint),
        "task": splits.task,
        "metric": headline_metric(summary["dense"]),
        **summary,
    }
    if save_to is not None and report is not None:
        saved = save_pruned(
            Path(save_to), pruned, summary, write_pruning_report, save,
            run_config=run.config, step=int(state.get("step", 0)),
            config_text=(find_run_folder(run.checkpoint) / "config.json").read_text(),
            state={"masks": report.masks.state_dict(), "pruning": report.summary()},
        )  # fmt: skip
        logger.info("pruned checkpoint written to %s", saved)
    return summary


def _measured_sweep(
    model: ModelT,
    sparsities: tuple[float, ...],
    measure: Callable[[ModelT], dict[str, float]],
    spec: MaskSpec,
    method: str,
    calibration: list[dict[str, Any]] | None,
    calibration_source: str,
    progress: bool,
    device: torch.device | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], PruningReport | None, ModelT]:
    """The dense metrics and :func:`sweep`, as the summary entries both commands share."""
    dense = measure(model)
    rows, report, pruned = sweep(
        model,
        sparsities,
        measure,
        spec=spec,
        method=method,
        calibration=calibration,
        progress=progress,
        device=device,
        options=options,
    )
    summary = {
        "method": method,
        "spec": spec.as_dict(),
        "calibration": _calibration_entry(method, calibration_source, calibration),
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


def _measure(
    dataset: Any, task: str, batch_size: int, device: torch.device | None, spec: MaskSpec
) -> Callable[[nn.Module], dict[str, float]]:
    """The metrics of a model on ``dataset``: in place, or, with a compute ``device`` other
    than the model's, one block at a time on it (the model stays where it is)."""

    def measure(model: nn.Module) -> dict[str, float]:
        if device is None or device == home_device(model):
            return evaluate(model, dataset, task, batch_size=batch_size)
        found = find_blocks(model, spec.select(model).names)
        if found is None:
            raise ValueError(
                f"evaluating on {device} moves one Transformer block at a time, but the model"
                f" has no block list (looked for one such as {BLOCK_EXAMPLES})"
            )
        return evaluate_block_by_block(model, found[0], dataset, task, batch_size, device)

    return measure


def _hf_measure(
    loaded: Any, evaluation: Any, batch_size: int, device: torch.device | None, spec: MaskSpec
) -> Callable[[nn.Module], dict[str, float]]:
    """The metrics of a Hugging Face folder's model: its task's, or for a sentence encoder the
    fidelity of its embeddings to the dense model's
    (:mod:`convergent.commands.sentence_embeddings`), scored in memory on its own device."""
    if loaded.kind != SENTENCE_EMBEDDING:
        return _measure(evaluation.dataset, evaluation.task, batch_size, device, spec)
    if device is not None and device != home_device(loaded.model):
        raise ValueError(
            f"a sentence encoder is scored in memory where it is loaded, on the CPU; leave out"
            f" {option('device', str(device))}"
        )
    return embedding_fidelity(evaluation.dataset, pooling_mode(loaded.path), batch_size)


def _report_writer(loaded: Any) -> Callable[[Path, dict[str, Any]], None]:
    """Writes the report into the staging folder, and for a sentence encoder the folder's
    sentence-transformers files beside it (so the pruned folder loads as the original did)."""

    def write(staging: Path, summary: dict[str, Any]) -> None:
        if loaded.kind == SENTENCE_EMBEDDING:
            copy_sentence_transformers_files(loaded.path, staging)
        write_pruning_report(staging, summary)

    return write


def _calibration_entry(
    method: str, source: str, batches: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    if batches is None:
        return None
    examples = sum(len(next(iter(batch.values()))) for batch in batches)
    return {"data": source, "examples": examples, "method": method}


def prune_hf_folder(
    path: str | Path,
    sparsities: tuple[float, ...] | None = None,
    *,
    data: str | None = None,
    examples: int | None = None,
    max_length: int = 64,
    seed: int = 0,
    spec: MaskSpec | None = None,
    method: str = "magnitude",
    calibration_data: str | None = None,
    calibration_examples: int = 128,
    save_to: str | Path | None = None,
    save: SaveOptions | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    low_memory: bool = False,
    statistics: str = "float64",
    progress: bool = False,
) -> dict[str, Any]:
    """Prune a ``save_pretrained`` folder one-shot at each sparsity, evaluated before and after.

    A causal LM is scored by perplexity, exp(mean next-token cross-entropy), a sequence
    classifier by accuracy, both on the validation split of ``data`` tokenized with the
    folder's tokenizer (see :mod:`convergent.commands.hf_folders`).

    Args:
        path: the model folder.
        sparsities: targets in [0, 1) (None: :data:`DEFAULT_SPARSITIES`; an N:M pattern
            prunes 1 - N/M, its one target).
        data: the data source (default ``austen`` for a causal LM, ``rt-sentences`` for a
            classifier).
        examples: evaluate on the first this many validation examples (None: all).
        max_length: tokens per example.
        seed: the split seed (and the calibration sample's).
        spec: which weights, the distribution and the pattern; None is ``MaskSpec()``.
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        calibration_data: the source whose *train* split Wanda and SparseGPT calibrate on
            (default: ``data``'s).
        calibration_examples: how many training examples they calibrate on.
        save_to: a new (or empty) folder for the model pruned at the last sparsity, written
            with the tokenizer, ``pruning.json``, ``pruning.md`` and ``pruning.png``.
        save: how ``save_to`` is written (compressed by default; :class:`SaveOptions`; with
            ``low_memory``, one shard per block, and no speed figures).
        device: where blocks are calibrated, pruned and evaluated (None: the model's device,
            the CPU); the model stays in CPU memory.
        dtype: the dtype to load, prune and save in (None: the folder's).
        low_memory: stream the blocks from the folder's safetensors files, one in memory at a
            time, and write each pruned block to ``save_to`` (one target, ``save_to``
            required; :mod:`convergent.commands.prune_streamed`).
        statistics: the dtype Wanda's and SparseGPT's calibration statistics are gathered
            and factorized in, ``"float64"`` or ``"float32"``.
        progress: progress bars over the blocks.

    Returns:
        ``{"checkpoint", "kind", "architecture", "data", "examples", "task", "metric",
        "method", "spec", "calibration", "dense", "rows", "layers", "excluded", "notes",
        "saved"}``; ``layers`` holds each pruned matrix at the last target.
    """
    spec = MaskSpec.given(spec)
    sparsities = resolve_targets(sparsities, spec)
    options = pruner_options_for(method, statistics)
    check_one_shot(method, spec, options)
    check_calibration_examples(calibration_examples)
    compute = check_device(device, dtype)
    if save_to is not None:
        check_save_folder(save_to)
    if low_memory:
        return prune_hf_folder_streamed(
            path,
            sparsities,
            save_to=save_to,
            data=data,
            examples=examples,
            max_length=max_length,
            seed=seed,
            spec=spec,
            method=method,
            calibration_data=calibration_data,
            calibration_examples=calibration_examples,
            calibration_batch_size=CALIBRATION_BATCH_SIZE,
            device=compute,
            dtype=dtype,
            dense=(save or SaveOptions()).dense,
            options=options,
            progress=progress,
        )
    loaded = load_hf_folder(path, dtype)
    data = data or DEFAULT_DATA[loaded.kind]
    evaluation = evaluation_data(loaded, data, seed=seed, max_length=max_length, examples=examples)
    batch_size = evaluation_batch_size(loaded, max_length)
    calibration = None
    if method != "magnitude" or spec.distribution == "owl":
        source = evaluation_data(
            loaded,
            calibration_data or data,
            seed=seed,
            max_length=max_length,
            examples=calibration_examples,
            split="train",
        )
        calibration = calibration_batches(
            source.dataset, len(source.dataset), CALIBRATION_BATCH_SIZE, seed
        )

    common, report, pruned = _measured_sweep(
        loaded.model,
        sparsities,
        _hf_measure(loaded, evaluation, batch_size, compute, spec),
        spec,
        method,
        calibration,
        f"train split of {calibration_data or data}",
        progress,
        compute,
        options,
    )
    summary = {
        **evaluation_summary(path, loaded, evaluation, max_length, seed),
        **common,
    }
    if save_to is not None and report is not None:
        save_pruned(Path(save_to), pruned, summary, _report_writer(loaded), save,
                    tokenizer=loaded.tokenizer)  # fmt: skip
        logger.info("pruned model written to %s", save_to)
    return summary
