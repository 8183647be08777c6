"""What ``convergent prune`` prints and writes beside a pruned model: the metric against
sparsity, the share of zeros in the pruned layers and in the whole model, the weights left
dense and why, and each matrix's sparsity (``pruning.json``, ``pruning.md``, ``pruning.png``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from convergent.commands.pruned_folder import saved_lines, saved_markdown
from convergent.io import write_text_atomically
from convergent.report import layer_sparsity_table, markdown_table, plot_layer_sparsity

METRICS = ("loss", "accuracy", "perplexity", "rmse", "embedding_cosine")


def headline_metric(metrics: dict[str, float]) -> str:
    """The metric a summary leads with: perplexity, accuracy, RMSE, a sentence encoder's
    embedding cosine to the dense model's, else the loss."""
    for key in ("perplexity", "accuracy", "rmse", "embedding_cosine"):
        if key in metrics:
            return key
    return "loss"


def metric_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row for the dense model and one per target: the share of zeros in the pruned
    layers and in the whole model, and the metrics."""
    keys = [key for key in METRICS if key in summary["dense"]]
    rows = [
        {
            "target": "dense",
            "pruned layers' zeros": 0.0,
            "whole model's zeros": 0.0,
            **{key: summary["dense"][key] for key in keys},
        }
    ]
    return rows + [
        {
            "target": row["target"],
            "pruned layers' zeros": row["sparsity"],
            "whole model's zeros": row["model_sparsity"],
            **{key: row[key] for key in keys},
        }
        for row in summary["rows"]
    ]


def dense_rows(summary: dict[str, Any]) -> list[dict[str, str]]:
    """The weight matrices left dense, and why."""
    return [{"left dense": name, "why": why} for name, why in summary["excluded"].items()]


def format_prune_summary(summary: dict[str, Any]) -> str:
    """The text ``convergent prune`` prints: the table, the weights left dense, the output."""
    if summary.get("kind"):  # a Hugging Face folder, measured on named data
        heading = (
            f"model: {summary['checkpoint']} ({summary['architecture']}, {summary['data']} "
            f"validation split, {summary['examples']} examples)"
        )
    else:
        heading = f"checkpoint: {summary['checkpoint']} ({summary['task']}, validation split)"
    lines = [heading, "", markdown_table(metric_rows(summary))]
    lines += [f"left dense: {name}: {why}" for name, why in summary["excluded"].items()]
    lines += [f"note: {caveat}" for caveat in summary.get("caveats", [])]
    if summary.get("block_sparsities"):
        values = summary["block_sparsities"].values()
        lines.append(f"OWL block sparsities: {min(values):.4f} to {max(values):.4f}")
    if summary.get("saved"):
        what = "model and report" if summary.get("kind") else "checkpoint"
        lines.append(f"pruned {what}: {summary['saved']}")
        lines += saved_lines(summary)
    return "\n".join(lines)


def write_pruning_report(folder: Path, summary: dict[str, Any]) -> None:
    """``pruning.json``, ``pruning.md`` and ``pruning.png`` of ``summary`` into ``folder``."""
    write_text_atomically(folder / "pruning.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomically(folder / "pruning.md", pruning_markdown(summary))
    plot_pruning(summary, folder / "pruning.png")


def pruning_markdown(summary: dict[str, Any]) -> str:
    """``pruning.md``: what was pruned, how, and what it cost."""
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
    where = f" Pruned on {summary['device']} in {summary['dtype']}" + (
        ", one block in memory at a time (low memory)." if summary.get("low_memory") else "."
    )
    lines = [
        f"# One-shot {summary['method']} pruning: {summary['checkpoint']}",
        "",
        f"{measured}; {spec['distribution']} {spec['pattern']} masks.{calibrated}{where}"
        f" This folder holds the model pruned at {last['target']}: {last['sparsity']:.4f} of"
        f" the pruned layers' weights and {last['model_sparsity']:.4f} of all the model's"
        " weights are zero.",
        "",
        f"## {summary['metric'].capitalize()} against sparsity",
        "",
        markdown_table(metric_rows(summary)),
        *[f"Note: {caveat}.\n" for caveat in summary.get("caveats", [])],
        "![pruning](pruning.png)",
        "",
    ]
    if summary["excluded"]:
        lines += ["## Weights left dense", "", markdown_table(dense_rows(summary))]
    lines += ["## Sparsity per pruned matrix", "", layer_sparsity_table(summary["layers"])]
    lines += saved_markdown(summary)
    return "\n".join(lines) + "\n"


def plot_pruning(summary: dict[str, Any], path: Path) -> Path:
    """The metric against achieved sparsity (dense at 0), and each matrix's sparsity.

    Args:
        summary: what :func:`~convergent.commands.prune.prune_run` or
            :func:`~convergent.commands.prune.prune_hf_folder` returns.
        path: the PNG to write.

    Returns:
        ``path``.
    """
    metric = summary["metric"]
    from matplotlib.figure import Figure  # here: half a second of CPU, for a plot only

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
