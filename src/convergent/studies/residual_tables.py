"""The tables of the ``residual`` study's report: per beta, per depth, and the depth gaps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .residual_depth import DepthRun


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def beta_table(rows: list[dict[str, Any]], late: dict[tuple, dict[str, Any]]) -> list[dict]:
    table = []
    for beta in sorted({row["beta"] for row in rows}):
        chosen = [row for row in rows if row["beta"] == beta]
        rate, rate_spread = mean_and_spread([row["rate"] for row in chosen])
        late_rate, _ = mean_and_spread([late[(row["seed"], beta)]["rate"] for row in chosen])
        entry: dict[str, Any] = {"beta": beta, "seeds": len(chosen)}
        entry["final_loss"] = float(np.mean([row["final_loss"] for row in chosen]))
        entry["rate (full curve)"] = rate
        if len(chosen) > 1:
            entry["rate sd over seeds"] = rate_spread
        else:
            entry["rate 95% interval"] = (
                f"[{chosen[0]['rate_low']:.5f}, {chosen[0]['rate_high']:.5f}]"
            )
        entry["r_squared"] = float(np.mean([row["r_squared"] for row in chosen]))
        entry["rate (late window)"] = late_rate
        entry["effective rate"] = float(np.mean([row["effective_rate"] for row in chosen]))
        for key, label in (
            ("sigma_min_mean", "sigma_min A"),
            ("sigma_max_mean", "sigma_max A"),
            ("residual_sigma_min_mean", "sigma_min bX+A"),
            ("residual_sigma_max_mean", "sigma_max bX+A"),
            ("residual_squared_ratio_mean", "(min/max)^2 bX+A"),
            ("squared_ratio_mean", "(min/max)^2 A"),
        ):
            entry[label] = float(np.mean([row[key] for row in chosen]))
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
