"""The tables of the ``residual`` study's report: per regime and beta, per depth, the depth gaps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..diagnostics import fit_rate_with_floor
from .residual_claims import Regime, transient_steps
from .residual_depth import DepthRun


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def regime_table(
    regime: Regime, transient_fraction: float, tolerance: float, confidence: float
) -> list[dict]:
    """Per beta, over the seeds of one regime: final loss, the bound test from t0, the certified
    and floor-fit rates, the band speed and the spectra."""
    start = transient_steps(regime.steps, transient_fraction)
    table = []
    for beta in regime.betas:
        measured = regime.at(beta)
        runs = [r for s in regime.seeds for r in regime.runs[s] if float(r["beta"]) == beta]
        decays = []
        for run in runs:
            try:
                decays.append(fit_rate_with_floor(run["losses"], start, confidence=confidence))
            except ValueError:
                continue
        entry: dict[str, Any] = {"beta": beta, "seeds": len(measured)}
        entry["final_loss"] = float(np.mean([m.final for m in measured]))
        entry["under the bound"] = f"{sum(m.excess <= tolerance for m in measured)}/{len(measured)}"
        entry["largest excess"] = max(m.excess for m in measured)
        entry["certified rate"] = float(np.mean([m.certified for m in measured]))
        entry["floor-fit rate"] = (
            float(np.mean([fit.rate for fit in decays])) if decays else float("nan")
        )
        entry["floor-fit R^2"] = (
            float(np.mean([fit.r_squared for fit in decays])) if decays else float("nan")
        )
        speed, speed_spread = mean_and_spread([regime.speeds[s][beta] for s in regime.seeds])
        entry["band speed"] = speed
        if len(measured) > 1:
            entry["band speed sd"] = speed_spread
        for key, label in (
            ("squared_ratio_mean", "(min/max)^2 A"),
            ("residual_squared_ratio_mean", "(min/max)^2 bX+A"),
            ("residual_sigma_min_min", "smallest sigma_min bX+A"),
        ):
            entry[label] = float(np.mean([m.row[key] for m in measured]))
        table.append(entry)
    return table


def worst_final_losses(rows: Sequence[dict[str, Any]]) -> dict[float, float]:
    """Step size -> its worst final training loss over the tuning rows (one per selection
    seed); inf when a run diverged from any seed (a flagged or non-finite loss)."""
    worst: dict[float, float] = {}
    for row in rows:
        lost = row["diverged"] or not np.isfinite(row["final_loss"])
        loss = np.inf if lost else float(row["final_loss"])
        worst[row["lr"]] = max(worst.get(row["lr"], -np.inf), loss)
    return worst


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
