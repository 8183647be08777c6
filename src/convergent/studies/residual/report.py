"""The ``residual`` study's report: its tables, figures (``matplotlib.figure.Figure``, never
pyplot) and notes, from the runs and the stored regimes (`measures.Regime`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from convergent.diagnostics import fit_rate_with_floor
from convergent.report import moving_average
from convergent.studies.residual.claims import RISE_TOLERANCE
from convergent.studies.residual.config import Config
from convergent.studies.residual.measures import Regime, transient_steps, worst_final_losses
from convergent.studies.residual.runs import DepthRun, GradientDescentRun


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


SPECTRA_COLUMNS = {
    "squared_ratio_mean": "(min/max)^2 A",
    "residual_squared_ratio_mean": "(min/max)^2 bX+A",
    "residual_sigma_min_min": "smallest sigma_min bX+A",
}


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def regime_table(
    regime: Regime, transient_fraction: float, tolerance: float, confidence: float
) -> list[dict]:
    """Per beta, over the seeds of one regime: final loss, the bound test from t0, the certified
    and floor-fit rates, the largest rise of the loss after t0, the band speed and the
    spectra."""
    start = transient_steps(regime.steps, transient_fraction)
    table = []
    for beta in regime.betas:
        measured = regime.at(beta)
        fits = []
        for run in (r for s in regime.seeds for r in regime.runs[s] if float(r["beta"]) == beta):
            with contextlib.suppress(ValueError):
                fits.append(fit_rate_with_floor(run["losses"], start, confidence=confidence))
        speed, spread = mean_and_spread([regime.speeds[s][beta] for s in regime.seeds])
        table.append(
            {
                "beta": beta,
                "seeds": len(measured),
                "final_loss": _mean([m.final for m in measured]),
                "under the bound": f"{sum(m.excess <= tolerance for m in measured)}/{len(measured)}",
                "largest excess": max(m.excess for m in measured),
                "certified rate": _mean([m.certified for m in measured]),
                "largest rise": max(m.rise for m in measured),
                "floor-fit rate": _mean([fit.rate for fit in fits]),
                "floor-fit R^2": _mean([fit.r_squared for fit in fits]),
                "band speed": speed,
                **({"band speed sd": spread} if len(measured) > 1 else {}),
                **{
                    label: _mean([m.row[key] for m in measured])
                    for key, label in SPECTRA_COLUMNS.items()
                },
            }
        )
    return table


def tuning_table(rows: Sequence[dict[str, Any]], grid: Sequence[float]) -> list[dict[str, Any]]:
    """Per beta: each grid step size's worst final training loss over the selection seeds
    ("diverged" where some seed diverged) and the selected one, flagged on the grid's edge."""
    table = []
    for beta in sorted({float(row["beta"]) for row in rows}):
        chosen = [row for row in rows if float(row["beta"]) == beta]
        entry: dict[str, Any] = {"beta": beta}
        for lr, loss in sorted(worst_final_losses(chosen).items()):
            entry[f"lr {lr:.4g}"] = "diverged" if loss == np.inf else loss
        selected = sorted({row["lr"] for row in chosen if row["selected"]})
        entry["selected lr"] = selected[0] if selected else "none (all diverged)"
        edge = bool(selected) and selected[0] in (min(grid), max(grid))
        entry["on the grid's edge"] = "yes" if edge else "no"
        table.append(entry)
    return table


def depth_table(runs: list[DepthRun]) -> list[dict[str, Any]]:
    table = []
    for depth in sorted({run.depth for run in runs}):
        for beta in sorted({run.beta for run in runs}):
            chosen = [run for run in runs if run.depth == depth and run.beta == beta]
            tail = [float(np.mean(run.losses[-max(1, len(run.losses) // 10) :])) for run in chosen]
            loss, loss_spread = mean_and_spread(tail)
            error, error_spread = mean_and_spread([run.validation_error for run in chosen])
            row: dict[str, Any] = {
                "depth": depth,
                "beta": beta,
                "seeds": len(chosen),
                "final train loss": loss,
                "validation error": error,
            }
            if len(chosen) > 1:
                row["train loss sd"], row["error sd"] = loss_spread, error_spread
            row["initialization"] = chosen[0].initialization
            table.append(row)
    return table


def depth_gap_table(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per depth, the seed-mean final train loss and validation error at beta 0 minus beta 1."""
    gaps = []
    for depth in sorted({row["depth"] for row in table}):
        rows = {row["beta"]: row for row in table if row["depth"] == depth}
        if 0.0 in rows and 1.0 in rows:
            gaps.append(
                {
                    "depth": depth,
                    "loss gap (beta 0 - beta 1)": rows[0.0]["final train loss"]
                    - rows[1.0]["final train loss"],
                    "error gap (beta 0 - beta 1)": rows[0.0]["validation error"]
                    - rows[1.0]["validation error"],
                }
            )
    return gaps


def _saved(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


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
    return _saved(figure, path)


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
    return _saved(figure, path)


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
    axis.set_title(regime.label, fontsize=9)
    return _saved(figure, path)


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
    return _saved(figure, path)


def one_layer_report(
    config: Config,
    regimes: Sequence[Regime],
    runs: Sequence[GradientDescentRun],
    tuning: Sequence[dict[str, Any]],
    tuned: Sequence[GradientDescentRun],
    folder: Path,
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Part (a)'s tables and figures: per regime (the tuned one after its tuning table) its
    table, loss curves and speed-against-ratio plot; then the first regime's spectra."""
    tables: dict[str, list[dict[str, Any]]] = {}
    figures: list[str] = []
    for regime in regimes:
        if regime.lr is None:
            chosen, tag = list(tuned), "tuned"
            tables[
                "(a) step size tuned per beta (worst training loss over the selection seeds)"
            ] = tuning_table(tuning, config.tuned_lrs)
        else:
            chosen = [r for r in runs if r.lr == regime.lr and r.steps == regime.steps]
            tag = f"lr{regime.lr:g}"
        tables[f"(a) one-layer Transformer on weather-hourly, {regime.label}"] = regime_table(
            regime, config.transient_fraction, config.envelope_tolerance, config.confidence
        )
        figures += [
            plot_loss_curves(
                chosen, folder / f"residual_loss_curves_{tag}.png", config.transient_fraction
            ).name,
            plot_speed_against_ratio(regime, folder / f"residual_speed_vs_ratio_{tag}.png").name,
        ]
    first_lr, first_steps = config.regimes[0]
    first = [run for run in runs if run.lr == first_lr and run.steps == first_steps]
    figures.append(plot_spectra(first, folder / "residual_spectra.png").name)
    return tables, figures


def depth_report(
    runs: list[DepthRun], folder: Path
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Part (b)'s tables (per depth and beta, and the gaps by depth) and its loss curves."""
    rows = depth_table(runs)
    tables = {
        "(b) rt-sentences at depth, with and without residuals": rows,
        "(b) residual advantage by depth": depth_gap_table(rows),
    }
    return tables, [plot_depth_curves(runs, folder / "residual_depth.png").name]


def notes(config: Config) -> list[str]:
    """What the report says about the setting: models, data, regimes, criteria, spectra."""
    lines = [
        f"(a) One block (single-head softmax attention + GELU FFN of width {config.d_ff}, "
        f"residual beta on both sublayers, no LayerNorm), d_model = {config.d_model}, init "
        f"N(0, {config.resolved_init_std:.3g}^2) (1/sqrt(d_model): variance preserving without "
        "a norm), the same init seed for every beta (seeds vary the init only). Data: "
        f"{config.examples} training windows drawn once at random (data seed 0) of "
        f"{config.window} hours of weather-hourly (standardized), target the next hour's "
        "variables, read out from the last token. Full-batch GD (SGD, no momentum) in each "
        "regime (step size, steps): "
        + ", ".join(f"({lr:g}, {steps})" for lr, steps in config.regimes)
        + "; the same step size for every beta within a regime. Tuned regime: each beta's own "
        f"step size from the grid {[round(lr, 4) for lr in config.tuned_lrs]}: among the "
        "step sizes that diverged from none of the selection seeds' inits (seeds "
        f"{list(config.selection_seeds)}, no reported run's), the one whose worst training "
        f"loss after {config.tuning_steps} steps is lowest; then {config.tuned_steps} steps per "
        "reported seed. The theorem's rate carries the step size, and the stable step shrinks "
        "as sigma_max grows with beta: the rate claim is in the theorem's form only in "
        "the tuned regime.",
        "The bound (claim 1): from t0 = "
        f"{config.transient_fraction:.0%} of the steps, log L_t must stay within "
        f"{config.envelope_tolerance:g} of the chord between log L_t0 and log L_T (the geometric "
        "envelope rho^(t - t0) L_t0 through the window's ends); the floor is 0 (the model can "
        "interpolate 64 windows). 'certified rate' is the smallest rho the curve satisfies from "
        "t0; 'floor-fit rate' is exp(-k) of a least-squares fit of L* + C exp(-k t) from t0, "
        "reported, not a criterion. 'largest rise' is the most log L climbed back above the "
        "lowest loss it had reached after t0: GD within the theorem's step-size condition never "
        f"raises the loss, so a rise above {RISE_TOLERANCE:g} in any beta > 0 run (or a "
        "divergence) leaves the "
        "regime's bound and rate claims untested.",
        "Speed (claims 2 and 3): the mean slope of log L over a loss band common to every beta "
        "of the seed, from the lowest loss any beta has at t0 down to 1.05 x the highest final "
        "loss, so curves that start at different losses are compared over the same losses. "
        "Claim 2 takes the slowest step up in beta; claim 3 the slope of log speed on log "
        "(sigma_min/sigma_max)^2 of beta X + Attn(X) across beta > 0.",
        "Spectra: singular values of the T x d matrices Attn(X) (after the output projection, "
        "before the residual) and beta X + Attn(X), per example over the training subset, "
        f"averaged over examples and over the measurements (every {config.spectra_every} steps).",
    ]
    if not config.run_depth:
        return [*lines, "(b) was not run (run_depth=False)."]
    return [
        *lines,
        "(b) MiniLM-L6 (pretrained) with its layer list cut to the depth (first layers "
        "kept) or, for depth > 6, all six pretrained layers plus freshly initialized BERT "
        "layers (N(0, 0.02) weights) on top; beta scales the residual input inside both "
        "sublayer outputs of every layer: LayerNorm(dropout(dense(h)) + beta x). Mean "
        f"pooling and a new linear head; word embeddings frozen (in every setting, to save "
        f"time); AdamW at constant lr {config.depth_lr}, no weight decay, batch "
        f"{config.depth_batch_size}, {config.depth_steps} steps, the same batches for every "
        f"setting; {config.train_examples} training and {config.validation_examples} "
        f"validation sentences of at most {config.max_length} tokens. 'Final train loss' is "
        "the mean over the last 10 % of steps.",
    ]
