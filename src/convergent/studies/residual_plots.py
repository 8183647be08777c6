"""Figures of the ``residual`` study (``matplotlib.figure.Figure``, never pyplot)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..report import moving_average
from .residual_claims import Regime
from .residual_depth import DepthRun
from .residual_onelayer import GradientDescentRun


def _colors(count: int) -> list[Any]:
    from matplotlib import colormaps

    return [colormaps["viridis"](value) for value in np.linspace(0.0, 0.9, max(count, 1))]


def plot_loss_curves(
    runs: Sequence[GradientDescentRun], path: Path, transient_fraction: float
) -> Path:
    """Training loss (log scale) against the GD step, one line per beta (first seed solid),
    with the end of the transient t0 marked."""
    betas = sorted({run.beta for run in runs})
    step_sizes = sorted({run.lr for run in runs})
    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    for color, beta in zip(_colors(len(betas)), betas, strict=True):
        chosen = [r for r in runs if r.beta == beta]
        step_label = f", lr {chosen[0].lr:g}" if len(step_sizes) > 1 else ""
        for index, run in enumerate(chosen):
            axis.plot(
                run.losses,
                color=color,
                alpha=1.0 if index == 0 else 0.35,
                label=f"beta={beta:g}{step_label}" if index == 0 else None,
            )
    steps = max(len(run.losses) - 1 for run in runs)
    axis.axvline(int(transient_fraction * steps), color="grey", linestyle=":", label="t0")
    axis.set_yscale("log")
    axis.set_xlabel("full-batch GD step")
    axis.set_ylabel("training loss (MSE)")
    regime = f"lr {step_sizes[0]:g}" if len(step_sizes) == 1 else "lr tuned per beta"
    axis.set_title(f"one-layer Transformer on weather-hourly, {regime}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_spectra(runs: Sequence[GradientDescentRun], path: Path) -> Path:
    """sigma_min and sigma_max over training: of beta * X + Attn(X) (solid) and Attn(X)
    (dashed), first seed of each beta."""
    betas = sorted({run.beta for run in runs})
    figure = Figure(figsize=(11, 4))
    low_axis, high_axis = figure.subplots(1, 2)
    for color, beta in zip(_colors(len(betas)), betas, strict=True):
        run = next(r for r in runs if r.beta == beta)
        steps = run.spectra_steps
        low_axis.plot(steps, run.residual_sigma_min, color=color, label=f"beta={beta:g}")
        low_axis.plot(steps, run.sigma_min, color=color, linestyle="--")
        high_axis.plot(steps, run.residual_sigma_max, color=color, label=f"beta={beta:g}")
        high_axis.plot(steps, run.sigma_max, color=color, linestyle="--")
    for axis, name in ((low_axis, "sigma_min"), (high_axis, "sigma_max")):
        axis.set_yscale("symlog", linthresh=1e-4)
        axis.set_xlabel("full-batch GD step")
        axis.set_title(f"{name}: beta X + Attn(X) solid, Attn(X) dashed")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_speed_against_ratio(regime: Regime, path: Path) -> Path:
    """Band speed against mean (sigma_min / sigma_max)^2 of beta X + Attn(X), one point per
    run, on log-log axes (a line of slope 1 is speed proportional to the ratio)."""
    figure = Figure(figsize=(5, 4))
    axis = figure.subplots()
    betas = [beta for beta in regime.betas if beta > 0]
    drawn = 0
    for color, beta in zip(_colors(len(betas)), betas, strict=True):
        # A diverged run has no speed: only positive, finite points fit on log axes.
        points = [
            (regime.ratios(s)[beta], regime.speeds[s][beta])
            for s in regime.seeds
            if 0 < regime.ratios(s)[beta] < np.inf and 0 < regime.speeds[s][beta] < np.inf
        ]
        if points:
            axis.scatter(*zip(*points, strict=True), color=color, label=f"beta={beta:g}")
            drawn += len(points)
    if drawn:
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.legend(fontsize=8)
    else:
        axis.text(0.5, 0.5, "no run has a band speed", ha="center", transform=axis.transAxes)
    axis.set_xlabel("mean (sigma_min / sigma_max)^2 of beta X + Attn(X)")
    axis.set_ylabel("band speed, -d log L / d step")
    axis.set_title(regime.name, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_depth_curves(runs: Sequence[DepthRun], path: Path) -> Path:
    """Training loss (moving average) against the step, one panel per depth."""
    depths = sorted({run.depth for run in runs})
    figure = Figure(figsize=(4 * len(depths), 3.6))
    axes = np.atleast_1d(figure.subplots(1, len(depths), sharey=True))
    for axis, depth in zip(axes, depths, strict=True):
        for run in (r for r in runs if r.depth == depth):
            window = max(1, len(run.losses) // 10)
            axis.plot(
                moving_average(run.losses, window),
                color="tab:blue" if run.beta > 0 else "tab:red",
                alpha=1.0 if run.seed == runs[0].seed else 0.4,
                label=f"beta={run.beta:g}" if run.seed == runs[0].seed else None,
            )
        axis.set_title(f"depth {depth}")
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
    axes[0].set_ylabel("training loss (moving average)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path
