"""``convergent prune``: one-shot magnitude pruning of a trained run folder or checkpoint.

The run folder written by ``convergent train`` holds ``config.json`` and checkpoints; the
model is rebuilt from the config, its newest (or the named) checkpoint is loaded, and for
each sparsity a copy is pruned and evaluated on the validation split (loss, accuracy, and
perplexity for language models). With ``save_to``, the model pruned at the last sparsity is
written as a run folder (the run's ``config.json`` and ``checkpoints/``, so ``diagnose`` and
``prune`` take it) whose checkpoint state holds the masks (``{"masks": ..., "pruning": ...}``,
loadable with ``weights_only=True``); the masks can also be rebuilt from its weights alone
(``Masks.from_weights``).

A Hugging Face ``save_pretrained`` folder is pruned by :func:`prune_hf_folder` instead: it is
evaluated on a named data source (perplexity for a causal LM, accuracy for a classifier)
and the pruned model is written with ``save_pretrained`` beside a report (``pruning.json``,
``pruning.md``, ``pruning.png``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from matplotlib.figure import Figure
from torch import nn

from ..report import markdown_table
from ..sparse import PruningReport, prune_one_shot
from ..sparse.masks import check_sparsity
from ..train import evaluate, save_checkpoint
from ..train.checkpoint import write_text_atomically
from .hf_folders import (
    DEFAULT_DATA,
    evaluation_batch_size,
    evaluation_data,
    load_hf_folder,
    quiet_progress,
)
from .runs import load_run, prepare_new_run

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


ModelT = TypeVar("ModelT", bound=nn.Module)


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
    sparsities: tuple[float, ...] = (0.5, 0.7, 0.9),
    *,
    distribution: str = "uniform",
    pattern: str = "unstructured",
    include_embeddings: bool = False,
    include_first: bool = True,
    include_last: bool = False,
    save_to: str | Path | None = None,
) -> dict[str, Any]:
    """Prune a trained run one-shot at each sparsity and evaluate it on validation data.

    Args:
        path: a run folder, its ``checkpoints`` folder or one checkpoint folder.
        sparsities: targets in [0, 1).
        distribution: ``"uniform"`` (layer-wise, default) or ``"global"``.
        pattern: ``"unstructured"`` or ``"N:M"``.
        include_embeddings, include_first, include_last: see
            :func:`~convergent.sparse.prune_one_shot`.
        save_to: write the model pruned at the last sparsity here, as a run folder
            (``config.json`` and ``checkpoints/``) that ``diagnose`` and ``prune`` accept.

    Returns:
        ``{"checkpoint", "task", "dense": metrics, "rows": [per sparsity: target,
        sparsity, metrics], "excluded", "notes", "saved"}``.
    """
    for target in sparsities:
        check_sparsity(target)
    run = load_run(path)
    model, splits, state, checkpoint = run.model, run.splits, run.state, run.checkpoint
    dense = evaluate(model, splits.validation, splits.task)
    rows, report, pruned = sweep(
        model,
        sparsities,
        lambda candidate: evaluate(candidate, splits.validation, splits.task),
        distribution=distribution,
        pattern=pattern,
        include_embeddings=include_embeddings,
        include_first=include_first,
        include_last=include_last,
    )
    saved = None
    if save_to is not None and report is not None:
        prepare_new_run(save_to)
        write_text_atomically(
            Path(save_to) / "config.json",
            json.dumps(dataclasses.asdict(run.config), indent=2) + "\n",
        )
        saved = save_checkpoint(
            Path(save_to) / "checkpoints",
            int(state.get("step", 0)),
            pruned,
            {"masks": report.masks.state_dict(), "pruning": report.summary()},
            keep=1,
        )
        logger.info("pruned checkpoint written to %s", saved)
    return {
        "checkpoint": str(checkpoint),
        "task": splits.task,
        "dense": dense,
        "rows": rows,
        "excluded": report.excluded if report else {},
        "notes": report.notes if report else [],
        "saved": str(saved) if saved else None,
    }


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
    sparsities: tuple[float, ...] = (0.5, 0.7, 0.9),
    *,
    data: str | None = None,
    examples: int | None = None,
    max_length: int = 64,
    seed: int = 0,
    distribution: str = "uniform",
    pattern: str = "unstructured",
    include_embeddings: bool = False,
    include_first: bool = True,
    include_last: bool = False,
    save_to: str | Path | None = None,
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
        seed: the split seed.
        distribution, pattern, include_embeddings, include_first, include_last: see
            :func:`~convergent.sparse.prune_one_shot`.
        save_to: a new (or empty) folder for the model pruned at the last sparsity, written
            with ``save_pretrained`` with the tokenizer, ``pruning.json``, ``pruning.md`` and
            ``pruning.png``.

    Returns:
        ``{"checkpoint", "kind", "architecture", "data", "examples", "task", "metric",
        "dense", "rows", "layers", "excluded", "notes", "saved"}``; ``layers`` holds the
        sparsity of each pruned matrix at the last target.
    """
    for target in sparsities:
        check_sparsity(target)
    if save_to is not None:
        _check_empty_folder(Path(save_to))
    loaded = load_hf_folder(path)
    evaluation = evaluation_data(
        loaded,
        data or DEFAULT_DATA[loaded.kind],
        seed=seed,
        max_length=max_length,
        examples=examples,
    )
    batch_size = evaluation_batch_size(loaded, max_length)

    def measure(model: nn.Module) -> dict[str, float]:
        return evaluate(model, evaluation.dataset, evaluation.task, batch_size=batch_size)

    dense = measure(loaded.model)
    rows, report, pruned = sweep(
        loaded.model,
        sparsities,
        measure,
        distribution=distribution,
        pattern=pattern,
        include_embeddings=include_embeddings,
        include_first=include_first,
        include_last=include_last,
    )
    layers = (
        [
            {"name": name, "shape": list(mask.shape), "sparsity": sparsity}
            for (name, mask), sparsity in zip(
                report.masks.items(), report.masks.per_parameter_sparsity().values(), strict=True
            )
        ]
        if report
        else []
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
        "distribution": distribution,
        "pattern": pattern,
        "task": evaluation.task,
        "metric": "perplexity" if evaluation.task == "lm" else "accuracy",
        "dense": dense,
        "rows": rows,
        "layers": layers,
        "excluded": report.excluded if report else {},
        "notes": report.notes if report else [],
        "saved": None,
    }
    if save_to is not None and report is not None:
        summary["saved"] = str(save_to)
        _save_pruned_folder(Path(save_to), pruned, loaded.tokenizer, summary)
        logger.info("pruned model written to %s", save_to)
    return summary


def _check_empty_folder(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(
            f"the --save folder {folder} already exists and is not empty; name a new folder"
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
        write_text_atomically(staging / "pruning.json", json.dumps(summary, indent=2) + "\n")
        write_text_atomically(staging / "pruning.md", _pruning_markdown(summary))
        plot_pruning(summary, staging / "pruning.png")
        if folder.exists():
            folder.rmdir()  # empty, checked above; os.replace cannot replace a folder
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _metric_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    keys = [key for key in ("loss", "accuracy", "perplexity", "rmse") if key in summary["dense"]]
    rows = [{"target": "dense", "sparsity": 0.0, **{k: summary["dense"][k] for k in keys}}]
    return rows + [
        {"target": row["target"], "sparsity": row["sparsity"], **{k: row[k] for k in keys}}
        for row in summary["rows"]
    ]


def _pruning_markdown(summary: dict[str, Any]) -> str:
    last = summary["rows"][-1]
    lines = [
        f"# One-shot magnitude pruning: {summary['checkpoint']}",
        "",
        f"{summary['architecture']} ({summary['kind']}), {summary['distribution']} "
        f"{summary['pattern']} pruning, evaluated on {summary['examples']} validation examples "
        f"of `{summary['data']}` ({summary['max_length']} tokens each). This folder holds the "
        f"model pruned at {last['target']} (achieved {last['sparsity']:.4f} of the prunable "
        "weights).",
        "",
        f"## {summary['metric'].capitalize()} against sparsity",
        "",
        markdown_table(_metric_rows(summary)),
        "![pruning](pruning.png)",
        "",
        "## Sparsity per pruned matrix",
        "",
        markdown_table(
            [{**row, "shape": "x".join(map(str, row["shape"]))} for row in summary["layers"]]
        ),
    ]
    lines += [f"- {note}" for note in summary["notes"]]
    return "\n".join(lines) + "\n"


def plot_pruning(summary: dict[str, Any], path: Path) -> Path:
    """The metric against achieved sparsity (dense at 0), and each matrix's sparsity.

    Args:
        summary: what :func:`prune_hf_folder` returns.
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
    metric_axis.set_title(f"{metric} after one-shot pruning ({summary['examples']} examples)")
    if metric == "perplexity":
        metric_axis.set_yscale("log")
    sparsity = [row["sparsity"] for row in summary["layers"]]
    layer_axis.bar(range(len(sparsity)), sparsity, color="tab:purple")
    layer_axis.set_ylim(0, 1)
    layer_axis.set_xlabel("pruned matrix (model order)")
    layer_axis.set_ylabel("fraction pruned")
    layer_axis.set_title(f"per-matrix sparsity at {summary['rows'][-1]['target']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path
