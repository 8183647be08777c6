"""Figures of the ``langevin`` study (``matplotlib.figure.Figure``, never pyplot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from convergent.regularize import diffusion_radius
from convergent.studies.langevin.measures import total_norm

COLORS = {"none": "tab:red", "log": "tab:blue", "power": "tab:green"}
LABELS = {"attention": "W_Q, W_K (1 layer)", "lora": "LoRA factors on q/k (2 layers)"}


def _band(
    axis: Any,
    steps: list[int],
    rows: list[list[float]],
    color: str,
    label: str,
    linestyle: str = "-",
    band: bool = True,
) -> None:
    """Mean over seeds as a line, min-max as a band (rows: one list of values per seed; no
    band with ``band=False``).

    The bound temperature's run length depends on each seed's start weights (through the
    relaxation time), so the seeds' traces may differ in length: the band covers the steps they
    all reached (records are at the same multiples of record_every in every seed).
    """
    common = min(len(steps), *(len(row) for row in rows))
    steps = steps[:common]
    values = np.asarray([row[:common] for row in rows], dtype=np.float64)
    axis.plot(steps, values.mean(axis=0), color=color, label=label, linestyle=linestyle)
    if band and len(rows) > 1:
        axis.fill_between(steps, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15)


def _joint_ratio(record: dict[str, Any], radii: dict[str, Any]) -> float:
    """sqrt(sum ||W_m||^2) / sqrt(sum r_m^2) over the matrices of one record."""
    return total_norm(record["norms"]) / total_norm(radii)


def plot_norms(data: dict[str, Any], config: Any, out_dir: Path) -> list[str]:
    """At the bound temperature, per experiment: left, each regularized variant's joint norm
    over its joint stationary radius (the statistic "bounded" scores), with the bound at 1, the
    tolerance dashed and the penalty-only chain dotted; right, the total norm without a
    regularizer against pure diffusion's RMS prediction."""
    names = []
    temperature = config.bound_temperature
    s = float(data["temperatures"][temperature])
    lr = float(config.langevin_lr)
    for experiment, seed_runs in data["runs"].items():
        variants = seed_runs[0]["phase2"][temperature]
        figure = Figure(figsize=(11, 4))
        bound_axis, diffusion_axis = figure.subplots(1, 2)
        for variant, first in variants.items():
            steps = [int(r["step"]) for r in first["trace"]]
            traces = [run["phase2"][temperature][variant] for run in seed_runs]
            totals = [[total_norm(r["norms"]) for r in t["trace"]] for t in traces]
            _band(diffusion_axis, steps, totals, COLORS.get(variant, "black"), variant)
            if variant == "none":
                numel = sum(int(n) for n in first["numel"].values())
                start = float(np.mean([row[0] for row in totals]))
                predicted = [diffusion_radius(start, numel, s, lr * step) for step in steps]
                diffusion_axis.plot(steps, predicted, "k--", label="pure diffusion (RMS)")
                continue
            color = COLORS.get(variant, "black")
            ratios = [[_joint_ratio(r, t["stationary_radius"]) for r in t["trace"]] for t in traces]
            _band(bound_axis, steps, ratios, color, variant)
            nulls = [run["null"][variant] for run in seed_runs]
            null_ratios = [
                [_joint_ratio(r, n["stationary_radius"]) for r in n["trace"]] for n in nulls
            ]
            label = f"{variant}: penalty alone (the null)"
            _band(bound_axis, steps, null_ratios, color, label, linestyle=":", band=False)
        bound_axis.axhline(1.0, color="black", linewidth=1, label="stationary radius")
        bound_axis.axhline(
            1.0 + config.bound_tolerance, color="grey", linestyle="--", label="tolerance"
        )
        bound_axis.set_title("sqrt(sum ||W||^2) / sqrt(sum r^2), the matrices together", fontsize=9)
        diffusion_axis.set_title("||all phase-2 matrices||_F", fontsize=9)
        for axis in (bound_axis, diffusion_axis):
            axis.set_xlabel("Langevin step")
            axis.legend(fontsize=7)
        figure.suptitle(
            f"{LABELS.get(experiment, experiment)}, s = {s:.3g} ({temperature}); "
            f"{len(seed_runs)} seed(s), band = min-max",
            fontsize=10,
        )
        figure.tight_layout()
        name = f"langevin_norms_{experiment}.png"
        figure.savefig(out_dir / name, dpi=110)
        names.append(name)
    return names


def plot_curves(data: dict[str, Any], out_dir: Path) -> list[str]:
    """Per experiment, one panel per temperature: test RMSE (solid) and the gap (dotted) of
    each variant against the Langevin step, in raw units."""
    names = []
    scale = float(data["labels_std"])
    for experiment, seed_runs in data["runs"].items():
        levels = list(seed_runs[0]["phase2"])
        figure = Figure(figsize=(4 * len(levels), 3.8))
        # Not shared: the hot runs sit far above the rest and would flatten their differences.
        axes = np.atleast_1d(figure.subplots(1, len(levels)))
        for axis, temperature in zip(axes, levels, strict=True):
            for variant, first in seed_runs[0]["phase2"][temperature].items():
                steps = [int(r["step"]) for r in first["trace"]]
                color = COLORS.get(variant, "black")
                for key, style in (("test_rmse", "-"), ("gap", ":")):
                    rows = [
                        [
                            scale * float(r[key])
                            for r in run["phase2"][temperature][variant]["trace"]
                        ]
                        for run in seed_runs
                    ]
                    label = f"{variant} {'test RMSE' if key == 'test_rmse' else 'gap'}"
                    _band(axis, steps, rows, color, label, linestyle=style, band=False)
            s = float(data["temperatures"][temperature])
            axis.set_title(f"{temperature} (s = {s:.3g})", fontsize=9)
            axis.set_xlabel("Langevin step")
        axes[0].set_ylabel("raw units of the solution field (y-scales differ)")
        axes[0].legend(fontsize=7)
        figure.suptitle(f"{LABELS.get(experiment, experiment)}: test RMSE and gap", fontsize=10)
        figure.tight_layout()
        name = f"langevin_curves_{experiment}.png"
        figure.savefig(out_dir / name, dpi=110)
        names.append(name)
    return names
