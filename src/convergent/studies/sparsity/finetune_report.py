"""Part (c)'s tables and figure: test accuracy after each pruner, HORST against AdamW."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from convergent.studies.sparsity.finetune_config import variants
from convergent.studies.sparsity.report import (
    COLORS,
    mean_of_finite,
    plot_band,
    spread_of_finite,
)
from convergent.studies.sparsity.selection import is_point

PERCENT = 100.0


def _accuracies(runs: list[dict[str, Any]], label: str) -> list[float]:
    return [PERCENT * float(unit["accuracy"][label]) for unit in runs]


def finetune_tables(finetune: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Final runs (test accuracy in %, mean and SD over seeds, per variant and optimizer), and
    every grid point (validation accuracy in %, move ratio)."""
    runs = finetune["runs"]
    rows = []
    for label in ["dense", *finetune["variants"]]:
        row: dict[str, Any] = {"pruned by": label}
        for name in ("adamw", "horst"):
            values = _accuracies(runs[name], label)
            row[f"{name} test accuracy (%)"] = mean_of_finite(values)
            row[f"{name} sd (points)"] = spread_of_finite(values) if len(values) > 1 else ""
        rows.append(row)
    grid = []
    for name, points in finetune["selection"].items():
        chosen = finetune["selected"][name]
        for point in points:
            accuracy = point["validation_accuracy"]
            grid.append(
                {
                    "optimizer": name,
                    **{
                        k: v
                        for k, v in point.items()
                        if k in ("lr", "weight_decay", "strength") and v is not None
                    },
                    "validation accuracy dense (%)": PERCENT * float(accuracy["dense"]),
                    "validation accuracy after SparseGPT 70 % (%)": PERCENT
                    * float(accuracy["sparsegpt 70%"]),
                    "move ratio (mirror / Adam)": point["move_ratio"]
                    if point["move_ratio"] is not None
                    else "",
                    "selected": "yes" if is_point(point, chosen) else "",
                }
            )
    return {"(c) MiniLM fine-tune, pruned one-shot: test accuracy": rows, "(c) grid": grid}


def plot_finetune(finetune: dict[str, Any], path: Path) -> Path:
    """Test accuracy against sparsity, one panel per pruner: HORST and AdamW, mean over the
    final seeds with a one-standard-deviation band (dense, 50 %, 70 %); 2:4 and OWL at 70 % as
    separate markers."""
    runs, found = finetune["runs"], variants(tuple(finetune["variants"]))
    pruners = [p for p in ("magnitude", "wanda", "sparsegpt") if any(v.pruner == p for v in found)]
    figure = Figure(figsize=(4 * max(1, len(pruners)), 4))
    axes = figure.subplots(1, max(1, len(pruners)), squeeze=False, sharey=True)[0]
    for axis, pruner in zip(axes, pruners, strict=False):
        for name in ("adamw", "horst"):
            uniform = [v for v in found if v.pruner == pruner and not v.owl and ":" not in v.target]
            by_key = {"dense": _accuracies(runs[name], "dense")}
            by_key |= {v.target: _accuracies(runs[name], v.label) for v in uniform}
            plot_band(axis, by_key, COLORS[name], f"{name}, uniform")
            for variant in found:
                if variant.pruner != pruner or variant in uniform:
                    continue
                values = _accuracies(runs[name], variant.label)
                axis.errorbar(
                    [PERCENT * variant.sparsity],
                    [mean_of_finite(values)],
                    yerr=[spread_of_finite(values) if len(values) > 1 else 0.0],
                    color=COLORS[name],
                    marker="s" if variant.owl else "^",
                    linestyle="none",
                    label=f"{name}, {'OWL' if variant.owl else variant.target}",
                )
        axis.set_title(f"(c) MiniLM, {pruner} ({len(runs['horst'])} seed(s))")
        axis.set_xlabel("sparsity (%)")
        axis.set_ylabel("test accuracy (%)")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path
