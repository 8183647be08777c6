"""The tables and figures of the ``descent`` study's report."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..data.perturb import PERTURBATIONS
from . import descent_parts as parts


def _spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _fmt(values: list[float], digits: int = 4) -> str:
    mean, std = _spread(values)
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if len(values) > 1 else "")


def text_tables(text: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    runs, levels = text["runs"], text["levels"]
    robustness = []
    for method in parts.METHODS:
        row: dict[str, Any] = {"model": method, "clean": _fmt([r["clean"] for r in runs[method]])}
        for kind, gammas in levels.items():
            for index, gamma in enumerate(gammas):
                row[f"{kind} {gamma:g}"] = _fmt([r[kind][index] for r in runs[method]])
        robustness.append(row)
    layers = []
    count = len(runs["erm"][0]["layer_losses"])
    for layer in range(count):
        layers.append(
            {
                "layer": layer,
                **{
                    method: _fmt([r["layer_losses"][layer] for r in runs[method]])
                    for method in parts.METHODS
                },
            }
        )
    constraints = [
        {
            "model": method,
            "fraction of constraints satisfied (test)": _fmt(
                [r["fraction_satisfied"] for r in runs[method]], 3
            ),
            "monotone in every seed": all(r["is_monotone"] for r in runs[method]),
            "largest increase f_l - f_(l-1)": _fmt([r["largest_increase"] for r in runs[method]]),
        }
        for method in parts.METHODS
    ]
    return {
        "(a) test accuracy, clean and perturbed (gamma)": robustness,
        "(a) per-layer test loss (cross-entropy)": layers,
        "(a) layer constraints on test data": constraints,
    }


def video_tables(
    video: dict[str, Any], noise_multiples: Sequence[float]
) -> dict[str, list[dict[str, Any]]]:
    runs = video["runs"]
    rmse = []
    for index, sigma in enumerate(video["sigmas"]):
        rmse.append(
            {
                "noise sigma": round(sigma, 4),
                "x training": noise_multiples[index],
                "noisy input": round(sigma, 4),
                **{m: _fmt([r["rmse"][index] for r in runs[m]]) for m in parts.METHODS},
            }
        )
    count = len(runs["erm"][0]["layer_losses"])
    layers = [
        {
            "layer": layer,
            **{m: _fmt([r["layer_losses"][layer] for r in runs[m]], 5) for m in parts.METHODS},
        }
        for layer in range(count)
    ]
    return {
        "(b) denoising test RMSE by noise level": rmse,
        "(b) per-layer test MSE at the training noise": layers,
    }


def _band(axis: Any, x: list[float], runs: list[list[float]], label: str, style: str) -> None:
    means = [statistics.fmean(column) for column in zip(*runs, strict=True)]
    axis.plot(x, means, style, label=label)
    if len(runs) > 1:
        stds = [statistics.stdev(column) for column in zip(*runs, strict=True)]
        axis.fill_between(
            x,
            [m - s for m, s in zip(means, stds, strict=True)],
            [m + s for m, s in zip(means, stds, strict=True)],
            alpha=0.2,
        )


def draw_figures(
    text: dict[str, Any], video: dict[str, Any], noise_multiples: Sequence[float], out: Path
) -> list[str]:
    names = []
    figure = Figure(figsize=(12, 3.6))
    for axis, kind in zip(figure.subplots(1, 3), PERTURBATIONS, strict=True):
        gammas = [0.0, *text["levels"][kind]]
        for method, style in zip(parts.METHODS, ("o--", "s-"), strict=True):
            runs = [[r["clean"], *r[kind]] for r in text["runs"][method]]
            _band(axis, gammas, runs, method, style)
        axis.set_title(f"{kind} perturbation")
        axis.set_xlabel(
            "gamma" + (" (replacement probability)" if kind == "discrete" else " (x embedding RMS)")
        )
        axis.set_ylabel("test accuracy")
        axis.legend()
    figure.tight_layout()
    figure.savefig(out / "robustness.png", dpi=110)
    names.append("robustness.png")

    figure = Figure(figsize=(11, 3.8))
    text_axis, video_axis = figure.subplots(1, 2)
    for method, style in zip(parts.METHODS, ("o--", "s-"), strict=True):
        runs = [r["layer_losses"] for r in text["runs"][method]]
        _band(text_axis, list(range(len(runs[0]))), runs, method, style)
        runs = [r["layer_losses"] for r in video["runs"][method]]
        _band(video_axis, list(range(len(runs[0]))), runs, method, style)
    text_axis.set_title("(a) MiniLM, rt-sentences: test loss per layer")
    text_axis.set_ylabel("cross-entropy")
    video_axis.set_title("(b) denoiser: test MSE per layer")
    video_axis.set_yscale("log")
    video_axis.set_ylabel("MSE")
    for axis in (text_axis, video_axis):
        axis.set_xlabel("layer l (0 = embedding output)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(out / "layer_losses.png", dpi=110)
    names.append("layer_losses.png")

    figure = Figure(figsize=(5.5, 3.8))
    axis = figure.subplots()
    multiples = list(noise_multiples)
    for method, style in zip(parts.METHODS, ("o--", "s-"), strict=True):
        _band(axis, multiples, [r["rmse"] for r in video["runs"][method]], method, style)
    axis.plot(multiples, video["sigmas"], ":", color="gray", label="noisy input")
    axis.axvline(1.0, color="gray", linewidth=0.8)
    axis.set_xlabel("test noise / training noise")
    axis.set_ylabel("test RMSE")
    axis.set_title("(b) street-video denoising")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "denoising.png", dpi=110)
    names.append("denoising.png")
    return names
