"""Figures of the ``sparsity`` study (``matplotlib.figure.Figure``, never pyplot)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure

COLORS = {"adamw": "tab:blue", "ham": "tab:orange", "horst": "tab:green"}


def _percent(key: str) -> float:
    return 0.0 if key == "dense" else float(key.rstrip("%"))


def _mean_and_spread(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, 0.0
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def plot_sparsity_curves(
    config: Any,
    accuracy: dict[str, dict[str, list[float]]],
    perplexity: dict[str, dict[str, list[float]]],
    path: Path,
) -> Path:
    """Top-1 (AC/DC) and perplexity (one-shot) against sparsity, one line per optimizer."""
    figure = Figure(figsize=(10, 4))
    left, right = figure.subplots(1, 2)
    for axis, results, label in (
        (left, accuracy, "top-1 test accuracy"),
        (right, perplexity, "validation perplexity"),
    ):
        for name, by_key in results.items():
            points = sorted(
                (_percent(key), *_mean_and_spread(values)) for key, values in by_key.items()
            )
            axis.errorbar(
                [p[0] for p in points],
                [p[1] for p in points],
                yerr=[p[2] for p in points],
                marker="o",
                capsize=3,
                color=COLORS.get(name),
                label=name,
            )
        axis.set_xlabel("sparsity (%)")
        axis.set_ylabel(label)
        axis.legend()
    left.set_title("(a) Fashion-MNIST ViT, AC/DC")
    right.set_title("(b) Austen char LM, one-shot")
    right.set_yscale("log")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_histograms(
    language: dict[str, torch.Tensor], vision: dict[str, torch.Tensor], path: Path
) -> Path:
    """Histograms of log10 |w| of the prunable weights, AdamW vs HORST (dense-trained)."""
    figure = Figure(figsize=(10, 4))
    axes = figure.subplots(1, 2)
    for axis, weights, title in (
        (axes[0], vision, "(a) ViT, dense"),
        (axes[1], language, "(b) char LM, dense"),
    ):
        for name in ("adamw", "horst"):
            if name not in weights:
                continue
            magnitudes = weights[name].abs().clamp_min(1e-12).log10().numpy()
            axis.hist(
                magnitudes,
                bins=80,
                range=(-8, 0),
                histtype="step",
                density=True,
                color=COLORS[name],
                label=name,
            )
        axis.set_xlabel("log10 |w|")
        axis.set_ylabel("density")
        axis.set_title(title)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path
