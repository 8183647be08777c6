"""Figures of ``convergent diagnose`` (``matplotlib.figure.Figure``, never pyplot)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from convergent.diagnostics.spectra import AttentionSpectra

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches (matplotlib is imported here, for plots only)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def plot_layerwise_losses(losses: Sequence[float], path: Path) -> Path:
    """f_0 .. f_L through the shared readout."""
    figure = _figure(5, 3.5)
    axis = figure.subplots()
    axis.plot(range(len(losses)), losses, "o-")
    axis.set_xlabel("layer (0 = embedding output)")
    axis.set_ylabel("loss through the shared readout")
    axis.set_title("layer-wise loss")
    return _save(figure, path)


def _quartiles(values: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    array = values.double().numpy()
    array = np.where(np.isfinite(array), array, np.nan)
    return tuple(np.nanpercentile(array, q, axis=1) for q in (25, 50, 75))


def plot_spectra(spectra: AttentionSpectra, path: Path) -> Path:
    """Per layer: median and quartiles over examples of sigma_min, sigma_max and the
    condition number, for Attn(X) and for beta X + Attn(X)."""
    figure = _figure(12, 3.6)
    axes = figure.subplots(1, 3)
    layers = np.arange(len(spectra.layer_names))
    pairs = (
        ("sigma_min", spectra.sigma_min, spectra.residual_sigma_min),
        ("sigma_max", spectra.sigma_max, spectra.residual_sigma_max),
        ("condition number", spectra.condition, spectra.residual_condition),
    )
    for axis, (title, plain, residual) in zip(axes, pairs, strict=True):
        for values, label, color in (
            (plain, "Attn(X)", "tab:red"),
            (residual, "beta X + Attn(X)", "tab:blue"),
        ):
            low, middle, high = _quartiles(values)
            axis.plot(layers, middle, "o-", color=color, label=label)
            axis.fill_between(layers, low, high, color=color, alpha=0.2)
        axis.set_yscale("log")
        axis.set_xlabel("layer")
        axis.set_title(f"{title} (median, quartiles)")
        axis.legend(fontsize=8)
    return _save(figure, path)


def plot_rank_collapse(values: torch.Tensor, path: Path) -> Path:
    """||X - 1 x_bar^T|| / ||X|| per hidden state: median and quartiles over examples."""
    figure = _figure(5, 3.5)
    axis = figure.subplots()
    low, middle, high = _quartiles(values)
    layers = np.arange(values.shape[0])
    axis.plot(layers, middle, "o-")
    axis.fill_between(layers, low, high, alpha=0.25)
    axis.set_ylim(bottom=0)
    axis.set_xlabel("layer (0 = embedding output)")
    axis.set_ylabel("||X - 1 mean^T|| / ||X||")
    axis.set_title("rank collapse (0 = rank one)")
    return _save(figure, path)


def plot_weights(
    weights: dict[str, torch.Tensor], rows: Sequence[dict[str, Any]], path: Path
) -> Path:
    """A histogram of every weight value and the fraction of exact zeros per matrix."""
    figure = _figure(12, 4)
    histogram_axis, sparsity_axis = figure.subplots(1, 2)
    values = torch.cat([w.float().flatten() for w in weights.values()]).numpy()
    histogram_axis.hist(values, bins=200, log=True, color="tab:gray")
    histogram_axis.set_xlabel("weight value")
    histogram_axis.set_ylabel("count (log)")
    histogram_axis.set_title(f"all {len(weights)} weight matrices ({values.size:,} values)")
    sparsity = [row["sparsity"] for row in rows]
    sparsity_axis.bar(range(len(rows)), sparsity, color="tab:purple")
    sparsity_axis.set_xlabel("weight matrix (model order)")
    sparsity_axis.set_ylabel("fraction of exact zeros")
    sparsity_axis.set_ylim(0, max(1e-3, max(sparsity, default=0.0) * 1.1))
    sparsity_axis.set_title(f"sparsity (overall {float(np.mean(values == 0)):.2%})")
    return _save(figure, path)


def plot_query_key_norms(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Frobenius and spectral norms of W_Q and W_K per layer, and ||W_Q^T W_K||_2."""
    figure = _figure(10, 3.6)
    frobenius_axis, spectral_axis = figure.subplots(1, 2)
    layers = np.arange(len(rows))
    for key, label in (("query", "W_Q"), ("key", "W_K")):
        frobenius_axis.plot(layers, [row[f"{key}_frobenius"] for row in rows], "o-", label=label)
        spectral_axis.plot(layers, [row[f"{key}_spectral"] for row in rows], "o-", label=label)
    spectral_axis.plot(
        layers, [row["query_key_spectral"] for row in rows], "s--", label="W_Q^T W_K"
    )
    frobenius_axis.set_title("Frobenius norm")
    spectral_axis.set_title("spectral norm")
    spectral_axis.set_yscale("log")
    for axis in (frobenius_axis, spectral_axis):
        axis.set_xlabel("layer")
        axis.legend(fontsize=8)
    return _save(figure, path)
