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
be rebuilt from its weights alone (``Masks.from_weights``).

A Hugging Face ``save_pretrained`` folder is pruned by :func:`prune_hf_folder` instead: it is
evaluated on a named data source (perplexity for a causal LM, accuracy for a classifier),
calibrated on the train split of a named source (by default the same one),
and the pruned model is written with ``save_pretrained`` beside a report (``pruning.json``,
``pruning.md``, ``pruning.png``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from matplotlib.figure import Figure
from torch import nn

from convergent.commands.hf_folders import (
    DEFAULT_DATA,
    evaluation_batch_size,
    evaluation_data,
    load_hf_folder,
    quiet_progress,
)
from convergent.commands.runs import find_run_folder, load_run, prepare_new_run
from convergent.io import write_text_atomically
from convergent.report import layer_sparsity_table, markdown_table, plot_layer_sparsity
from convergent.sparse import MaskSpec, PruningReport, prune_one_shot
from convergent.sparse.blockwise import check_method
from convergent.sparse.masks import check_sparsity
from convergent.train import calibration_batches, evaluate, save_checkpoint
from convergent.wording import option

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


ModelT = TypeVar("ModelT", bound=nn.Module)

DEFAULT_SPARSITIES = (0.5, 0.7, 0.9)
CALIBRATION_BATCH_SIZE = 16


def sweep(
    model: ModelT,
    sparsities: tuple[float, ...],
    measure: Callable[[ModelT], dict[str, float]],
    **options: Any,
) -> tuple[list[dict[str, Any]], PruningReport | None, ModelT]:
    """Prune a copy of ``model`` one-shot at each target and measure it.

    Args:
        model: the dense model (left unchanged).
        sparsities: the targets, in order.
        measure: the metrics of a model, e.g. validation loss and accuracy.
        **options: :func:`~convergent.sparse.prune_one_shot`'s selection options.

    Returns:
        (one row per target: target, sparsity reached, metrics; the last target's report;
        the model pruned at the last target, or ``model`` when there is none).
    """
    rows: list[dict[str, Any]] = []
    report, pruned = None, model
    for target in sparsities:
        pruned = copy.deepcopy(model)
        report = prune_one_shot(pruned, target, **options)
        rows.append({"target": target, "sparsity": report.sparsity, **measure(pruned)})
    return rows, report, pruned


def prune_run(
    path: str | Path,
    sparsities: tuple[float, ...] = DEFAULT_SPARSITIES,
    *,
    spec: MaskSpec | None = None,
    method: str = "magnitude",
    calibration_examples: int = 128,
    save_to: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Prune a trained run one-shot at each sparsity and evaluate it on validation data.

    Args:
        path: a run folder, its ``checkpoints`` folder or one checkpoint folder.
        sparsities: targets in [0, 1).
        spec: which weights, the distribution and the pattern; None is ``MaskSpec()``.
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        calibration_examples: examples of the run's training split that Wanda and SparseGPT
            calibrate on (a seeded sample; unused by magnitude).
        save_to: write the model pruned at the last sparsity here, as a run folder
            (``config.json`` and ``checkpoints/``) that ``diagnose`` and ``prune`` accept,
            with its report (``pruning.json``, ``pruning.md``, ``pruning.png``).
        progress: progress bars over the blocks.

    Returns:
        ``{"checkpoint", "task", "method", "spec", "calibration", "dense": metrics, "rows":
        [per sparsity: target, sparsity, metrics], "layers", "excluded", "notes", "saved"}``;
        ``layers`` holds each pruned matrix at the last target.
    """
    for target in sparsities:
        check_sparsity(target)
    spec = MaskSpec.given(spec)
    check_method(method, spec)
    if save_to is not None:
        _check_empty_folder(Path(save_to))
    run = load_run(path)
    model, splits, state, checkpoint = run.model, run.splits, run.state, run.checkpoint
    calibration = None
    if method != "magnitude":
        calibration = calibration_batches(
            splits.train, min(calibration_examples, len(splits.train)), CALIBRATION_BATCH_SIZE
        )
    summary, report, pruned = _measured_sweep(
        model,
        sparsities,
        lambda candidate: evaluate(candidate, splits.validation, splits.task),
        spec,
        method,
        calibration,
        "train split of the run's data",
        progress,
    )
    summary = {
        "checkpoint": str(checkpoint),
        "task": splits.task,
        "metric": _headline_metric(summary["dense"]),
        **summary,
    }
    if save_to is not None and report is not None:
        prepare_new_run(save_to)
        write_text_atomically(  # the run's own, with the notes on the defaults it chose
            Path(save_to) / "config.json",
            (find_run_folder(run.checkpoint) / "config.json").read_text(),
        )
        saved = save_checkpoint(
            Path(save_to) / "checkpoints",
            int(state.get("step", 0)),
            pruned,
            {"masks": report.masks.state_dict(), "pruning": report.summary()},
            keep=1,
        )
        summary["saved"] = str(saved)
        write_pruning_report(Path(save_to), summary)
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
    )
    summary = {
        "method": method,
        "spec": spec.as_dict(),
        "calibration": _calibration_entry(method, calibration_source, calibration),
        "dense": dense,
        "rows": rows,
        "layers": report.layers if report else [],
        "excluded": report.excluded if report else {},
        "notes": report.notes if report else [],
        "saved": None,
    }
    return summary, report, pruned


def _calibration_entry(
    method: str, source: str, batches: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    if batches is None:
        return None
    examples = sum(len(next(iter(batch.values()))) for batch in batches)
    return {"data": source, "examples": examples, "method": method}


def format_prune_summary(summary: dict[str, Any]) -> str:
    """The text ``convergent prune`` prints: a markdown table, the exclusions, the output."""
    if summary.get("kind"):  # a Hugging Face folder, measured on named data
        heading = (
            f"model: {summary['checkpoint']} ({summary['architecture']}, {summary['data']} "
            f"validation split, {summary['examples']} examples)"
        )
    else:
        heading = f"checkpoint: {summary['checkpoint']} ({summary['task']}, validation split)"
    lines = [heading, "", markdown_table(_metric_rows(summary))]
    lines += [f"note: {note}" for note in summary["notes"]]
    if summary.get("saved"):
        what = "model and report" if summary.get("kind") else "checkpoint"
        lines.append(f"pruned {what}: {summary['saved']}")
    return "\n".join(lines)


def prune_hf_folder(
    path: str | Path,
    sparsities: tuple[float, ...] = DEFAULT_SPARSITIES,
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
    progress: bool = False,
) -> dict[str, Any]:
    """Prune a ``save_pretrained`` folder one-shot at each sparsity, evaluated before and after.

    A causal LM is scored by perplexity, exp(mean next-token cross-entropy), a sequence
    classifier by accuracy, both on the validation split of ``data`` tokenized with the
    folder's tokenizer (see :mod:`convergent.commands.hf_folders`).

    Args:
        path: the model folder.
        sparsities: targets in [0, 1).
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
            with ``save_pretrained`` with the tokenizer, ``pruning.json``, ``pruning.md`` and
            ``pruning.png``.
        progress: progress bars over the blocks.

    Returns:
        ``{"checkpoint", "kind", "architecture", "data", "examples", "task", "metric",
        "method", "spec", "calibration", "dense", "rows", "layers", "excluded", "notes",
        "saved"}``; ``layers`` holds each pruned matrix at the last target.
    """
    for target in sparsities:
        check_sparsity(target)
    spec = MaskSpec.given(spec)
    check_method(method, spec)
    if save_to is not None:
        _check_empty_folder(Path(save_to))
    loaded = load_hf_folder(path)
    data = data or DEFAULT_DATA[loaded.kind]
    evaluation = evaluation_data(loaded, data, seed=seed, max_length=max_length, examples=examples)
    batch_size = evaluation_batch_size(loaded, max_length)
    calibration = None
    if method != "magnitude":
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

    def measure(model: nn.Module) -> dict[str, float]:
        return evaluate(model, evaluation.dataset, evaluation.task, batch_size=batch_size)

    common, report, pruned = _measured_sweep(
        loaded.model,
        sparsities,
        measure,
        spec,
        method,
        calibration,
        f"train split of {calibration_data or data}",
        progress,
    )
    summary: dict[str, Any] = {
        "checkpoint": str(path),
        "kind": loaded.kind,
        "architecture": loaded.architecture,
        "data": evaluation.data,
        "split": "validation",
        "examples": len(evaluation.dataset),
        "max_length": max_length,
        "seed": seed,
        "task": evaluation.task,
        "metric": "perplexity" if evaluation.task == "lm" else "accuracy",
        **common,
    }
    if save_to is not None and report is not None:
        summary["saved"] = str(save_to)
        _save_pruned_folder(Path(save_to), pruned, loaded.tokenizer, summary)
        logger.info("pruned model written to %s", save_to)
    return summary


def _headline_metric(metrics: dict[str, float]) -> str:
    for key in ("perplexity", "accuracy", "rmse"):
        if key in metrics:
            return key
    return "loss"


def _check_empty_folder(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(
            f"the {option('save_to')} folder {folder} already exists and is not empty; name a"
            " new folder"
        )


def _save_pruned_folder(
    folder: Path, model: PreTrainedModel, tokenizer: Any, summary: dict[str, Any]
) -> None:
    """Write the model, tokenizer and report into a hidden sibling, then rename it into
    place: a reader sees the whole pruned folder or none of it."""
    _check_empty_folder(folder)
    staging = folder.parent / f".{folder.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with quiet_progress():
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
        write_pruning_report(staging, summary)
        if folder.exists():
            folder.rmdir()  # empty, checked above; os.replace cannot replace a folder
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_pruning_report(folder: Path, summary: dict[str, Any]) -> None:
    """``pruning.json``, ``pruning.md`` and ``pruning.png`` of ``summary`` into ``folder``."""
    write_text_atomically(folder / "pruning.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomically(folder / "pruning.md", _pruning_markdown(summary))
    plot_pruning(summary, folder / "pruning.png")


def _metric_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    keys = [key for key in ("loss", "accuracy", "perplexity", "rmse") if key in summary["dense"]]
    rows = [{"target": "dense", "sparsity": 0.0, **{k: summary["dense"][k] for k in keys}}]
    return rows + [
        {"target": row["target"], "sparsity": row["sparsity"], **{k: row[k] for k in keys}}
        for row in summary["rows"]
    ]


def _pruning_markdown(summary: dict[str, Any]) -> str:
    last = summary["rows"][-1]
    spec = summary["spec"]
    if summary.get("kind"):
        measured = (
            f"{summary['architecture']} ({summary['kind']}), evaluated on {summary['examples']} "
            f"validation examples of `{summary['data']}` ({summary['max_length']} tokens each)"
        )
    else:
        measured = f"a {summary['task']} run, evaluated on its validation split"
    calibration = summary.get("calibration")
    calibrated = (
        f" Calibrated on {calibration['examples']} examples of the {calibration['data']}."
        if calibration
        else ""
    )
    lines = [
        f"# One-shot {summary['method']} pruning: {summary['checkpoint']}",
        "",
        f"{measured}; {spec['distribution']} {spec['pattern']} masks.{calibrated} This folder "
        f"holds the model pruned at {last['target']} (achieved {last['sparsity']:.4f} of the "
        "prunable weights).",
        "",
        f"## {summary['metric'].capitalize()} against sparsity",
        "",
        markdown_table(_metric_rows(summary)),
        "![pruning](pruning.png)",
        "",
        "## Sparsity per pruned matrix",
        "",
        layer_sparsity_table(summary["layers"]),
    ]
    lines += [f"- {note}" for note in summary["notes"]]
    return "\n".join(lines) + "\n"


def plot_pruning(summary: dict[str, Any], path: Path) -> Path:
    """The metric against achieved sparsity (dense at 0), and each matrix's sparsity.

    Args:
        summary: what :func:`prune_run` or :func:`prune_hf_folder` returns.
        path: the PNG to write.

    Returns:
        ``path``.
    """
    metric = summary["metric"]
    figure = Figure(figsize=(11, 4))
    metric_axis, layer_axis = figure.subplots(1, 2)
    points = [(0.0, summary["dense"][metric])]
    points += [(row["sparsity"], row[metric]) for row in summary["rows"]]
    metric_axis.plot(*zip(*points, strict=True), "o-", color="tab:blue")
    metric_axis.set_xlabel("sparsity of the prunable weights")
    metric_axis.set_ylabel(f"validation {metric}")
    metric_axis.set_title(f"{metric} after one-shot {summary['method']} pruning")
    if metric == "perplexity":
        metric_axis.set_yscale("log")
    plot_layer_sparsity(
        layer_axis, summary["layers"], f"per-matrix sparsity at {summary['rows'][-1]['target']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path
