"""Tables and plots from run metrics and study results.

Figures are built with ``matplotlib.figure.Figure`` directly rather than ``pyplot``, so
importing convergent never changes a notebook's plotting backend and no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "layer_sparsity_table",
    "markdown_table",
    "moving_average",
    "plot_layer_sparsity",
    "plot_training_curves",
]


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over at most ``window`` values (the first points use what exists)."""
    if window < 1:
        raise ValueError(f"window must be a positive integer, got {window}")
    averaged, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        averaged.append(total / min(index + 1, window))
    return averaged


def plot_training_curves(
    records: Sequence[dict[str, Any]], path: str | Path, title: str = ""
) -> Path:
    """Training loss (raw and smoothed) and validation metrics against the step.

    Args:
        records: metrics records as written by ``MetricsLogger`` (``step``, ``split``, ...).
        path: the PNG to write.
        title: a title for the figure.
    """
    train = [r for r in records if r["split"] == "train" and "loss" in r]
    validation = [r for r in records if r["split"] == "validation"]
    from matplotlib.figure import Figure  # here: half a second of CPU, for a plot only

    figure = Figure(figsize=(10, 4))
    loss_axis, score_axis = figure.subplots(1, 2)
    if train:
        steps = [r["step"] for r in train]
        losses = [r["loss"] for r in train]
        loss_axis.plot(steps, losses, color="tab:blue", alpha=0.3, label="train (per step)")
        window = max(1, len(losses) // 20)
        loss_axis.plot(
            steps,
            moving_average(losses, window),
            color="tab:blue",
            label=f"train (mean of {window})",
        )
    if validation:
        loss_axis.plot(
            [r["step"] for r in validation],
            [r["loss"] for r in validation],
            "o-",
            color="tab:orange",
            label="validation",
        )
        for key in ("accuracy", "rmse", "relative_l2", "perplexity"):
            if key in validation[0]:
                score_axis.plot(
                    [r["step"] for r in validation], [r[key] for r in validation], "o-", label=key
                )
        score_axis.legend()
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss")
    loss_axis.legend()
    score_axis.set_xlabel("step")
    score_axis.set_title("validation")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    output = Path(path)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    return output


def markdown_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 4
) -> str:
    """A GitHub-flavoured markdown table from dict rows (floats rounded to ``digits``).

    Without ``columns`` the table has every key of every row, in the order first seen: rows
    of different methods may carry different settings (AdamW's weight decay, HORST's alpha).
    """
    if not rows:
        return ""
    columns = list(columns or dict.fromkeys(key for row in rows for key in row))

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return (
                f"{value:.{digits}g}"
                if abs(value) < 1e-3 or abs(value) >= 1e4
                else f"{value:.{digits}f}"
            )
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def layer_sparsity_table(rows: Sequence[dict[str, Any]]) -> str:
    """The per-matrix sparsity rows of :func:`convergent.sparse.layer_sparsity` (or of a
    pruning report's ``layers``) as a markdown table, shapes written ``out x in``."""
    return markdown_table(
        [
            {**row, "shape": "x".join(map(str, row["shape"]))} if "shape" in row else row
            for row in rows
        ]
    )


def plot_layer_sparsity(axis: Any, rows: Sequence[dict[str, Any]], title: str) -> None:
    """A bar per weight matrix (model order): the fraction of its entries that are zero."""
    axis.bar(range(len(rows)), [row["sparsity"] for row in rows], color="tab:purple")
    axis.set_ylim(0, 1)
    axis.set_xlabel("weight matrix (model order)")
    axis.set_ylabel("fraction pruned")
    axis.set_title(title)
