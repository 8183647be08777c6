"""The figures of the ``sparsity`` study's report, its three parts (each a
``matplotlib.figure.Figure``, never pyplot)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure

from convergent.studies.sparsity.config import RMS_FRACTION, Config
from convergent.studies.sparsity.finetune_config import variants
from convergent.studies.sparsity.report import mean_of_finite, spread_of_finite

COLORS = {"adamw": "tab:blue", "ham": "tab:orange", "horst": "tab:green"}
LINESTYLES = {"magnitude": "-", "wanda": "--", "sparsegpt": ":"}


def _percent(key: str) -> float:
    return 0.0 if key == "dense" else float(key.rstrip("%"))


def _mean_and_spread(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, 0.0
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def plot_band(
    axis: Any, by_key: dict[str, list[float]], color: Any, label: str, linestyle: str = "-"
) -> None:
    """Mean over seeds with a +- one standard deviation band."""
    points = sorted((_percent(key), *_mean_and_spread(values)) for key, values in by_key.items())
    x = [p[0] for p in points]
    mean = [p[1] for p in points]
    axis.plot(x, mean, marker="o", color=color, label=label, linestyle=linestyle)
    axis.fill_between(
        x,
        [m - s for m, s in zip(mean, [p[2] for p in points], strict=True)],
        [m + s for m, s in zip(mean, [p[2] for p in points], strict=True)],
        color=color,
        alpha=0.2,
    )


def plot_sparsity_curves(
    config: Config,
    accuracy: dict[str, dict[str, list[float]]],
    perplexity: dict[str, dict[str, dict[str, list[float]]]],
    path: Path,
) -> Path:
    """Top-1 (AC/DC) and perplexity (one-shot, one line style per pruner) against sparsity:
    mean over the final seeds with a one-standard-deviation band, one color per optimizer."""
    figure = Figure(figsize=(10, 4))
    left, right = figure.subplots(1, 2)
    for name, by_key in accuracy.items():
        plot_band(left, by_key, COLORS.get(name), name)
    for name, by_pruner in perplexity.items():
        for pruner, by_key in by_pruner.items():
            plot_band(
                right, by_key, COLORS.get(name), f"{name}, {pruner}", LINESTYLES.get(pruner, "-")
            )
    for axis, label in ((left, "top-1 test accuracy"), (right, "test perplexity")):
        axis.set_xlabel("sparsity (%)")
        axis.set_ylabel(label)
        axis.legend(fontsize="small")
    left.set_title(f"(a) Fashion-MNIST ViT, AC/DC ({len(config.seeds)} seed(s))")
    right.set_title("(b) Austen char LM, one-shot")
    right.set_yscale("log")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_alpha_sweep(selection: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """HORST's validation accuracy at the selection sparsity against alpha (one line per
    learning rate), with the mirror/AdamW move ratio on a second axis; HAM's the same."""
    names = [name for name in ("horst", "ham") if name in selection]
    figure = Figure(figsize=(5 * max(1, len(names)), 4))
    axes = figure.subplots(1, max(1, len(names)), squeeze=False)[0]
    for axis, name in zip(axes, names, strict=False):
        ratio_axis = axis.twinx()
        for lr in sorted({entry["lr"] for entry in selection[name]}):
            entries = sorted(
                (e for e in selection[name] if e["lr"] == lr), key=lambda e: e["alpha"]
            )
            alphas = [e["alpha"] for e in entries]
            axis.plot(
                alphas, [e["validation_accuracy"] for e in entries], marker="o", label=f"lr {lr:g}"
            )
            ratio_axis.plot(
                alphas,
                [e["move_ratio"] for e in entries],
                linestyle="--",
                marker="x",
                color="gray",
            )
        axis.set_xscale("log")
        axis.set_xlabel("alpha")
        axis.set_ylabel("validation top-1 (selection sparsity)")
        axis.set_title(f"{name}: grid at the selection sparsity")
        axis.legend(loc="lower left")
        ratio_axis.set_yscale("log")
        ratio_axis.axhline(0.2, color="gray", linewidth=0.8, linestyle=":")
        ratio_axis.set_ylabel("mirror / AdamW move (dashed; dotted: 0.2)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_histograms(
    vision: dict[str, torch.Tensor], language: dict[str, torch.Tensor], path: Path
) -> Path:
    """Histograms of log10(|w| / RMS of its tensor) of the prunable weights of dense-trained
    models (first final seed), AdamW vs HORST; log-scaled density."""
    figure = Figure(figsize=(10, 4))
    axes = figure.subplots(1, 2)
    for axis, weights, title in (
        (axes[0], vision, "(a) ViT, dense"),
        (axes[1], language, "(b) char LM, dense"),
    ):
        for name in ("adamw", "ham", "horst"):
            if name not in weights:
                continue
            magnitudes = weights[name].abs().clamp_min(1e-12).log10().numpy()
            axis.hist(
                magnitudes,
                bins=80,
                range=(-6, 1),
                histtype="step",
                density=True,
                color=COLORS[name],
                label=name,
            )
        axis.axvline(math.log10(RMS_FRACTION), color="gray", linewidth=0.8, linestyle=":")
        axis.set_yscale("log")
        axis.set_xlabel("log10(|w| / RMS of its tensor); dotted: the near-zero line")
        axis.set_ylabel("density")
        axis.set_title(title)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_finetune(finetune: dict[str, Any], path: Path) -> Path:
    """Part (c)'s test accuracy against sparsity, one panel per pruner: HORST and AdamW, mean
    over the final seeds with a one-SD band (dense, 50 %, 70 %); 2:4 and OWL as markers."""
    runs, found = finetune["runs"], variants(tuple(finetune["variants"]))

    def accuracies(name: str, label: str) -> list[float]:
        return [100.0 * float(unit["accuracy"][label]) for unit in runs[name]]

    pruners = [p for p in ("magnitude", "wanda", "sparsegpt") if any(v.pruner == p for v in found)]
    figure = Figure(figsize=(4 * max(1, len(pruners)), 4))
    axes = figure.subplots(1, max(1, len(pruners)), squeeze=False, sharey=True)[0]
    for axis, pruner in zip(axes, pruners, strict=False):
        for name in ("adamw", "horst"):
            uniform = [v for v in found if v.pruner == pruner and not v.owl and ":" not in v.target]
            by_key = {"dense": accuracies(name, "dense")}
            by_key |= {v.target: accuracies(name, v.label) for v in uniform}
            plot_band(axis, by_key, COLORS[name], f"{name}, uniform")
            for variant in (v for v in found if v.pruner == pruner and v not in uniform):
                values = accuracies(name, variant.label)
                axis.errorbar(
                    [100.0 * variant.sparsity],
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
