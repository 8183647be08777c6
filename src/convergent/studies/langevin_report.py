"""Numbers, verdicts and figures of the `langevin` study, from its recorded traces.

A trace is a list of records {step, <norm keys>, train_rmse, test_rmse, train_relative_l2,
test_relative_l2, gap}, one per evaluation during phase 2, for one variant and one seed.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from convergent.studies.common import Claim

NORM_KEYS = {"attention": ("query", "key"), "lora": ("lora_A", "lora_B", "lora_BA")}
NORM_LABELS = {
    "query": "||W_Q||",
    "key": "||W_K||",
    "lora_A": "||A||",
    "lora_B": "||B||",
    "lora_BA": "||BA||",
}
COLORS = {"none": "tab:red", "log": "tab:blue", "power": "tab:green"}
STYLES = ("-", "--", ":")


def trend(trace: list[dict[str, float]], key: str, from_step: float = 0.0) -> float:
    """The least-squares slope of `key` against the step, over records at or after
    `from_step`, times the steps they span: the change of `key` that the trend explains."""
    part = [record for record in trace if record["step"] >= from_step]
    if len(part) < 2:
        return float("nan")
    steps = [r["step"] for r in part]
    values = [r[key] for r in part]
    mean_step, mean_value = statistics.fmean(steps), statistics.fmean(values)
    spread = sum((x - mean_step) ** 2 for x in steps)
    slope = (
        sum((x - mean_step) * (y - mean_value) for x, y in zip(steps, values, strict=True)) / spread
    )
    return slope * (steps[-1] - steps[0])


def relative_growth(trace: list[dict[str, float]], key: str) -> float:
    """`trend` of `key` over the second half of the trace, over its mean there: how much it
    grew, as a fraction, in that half."""
    from_step = trace[-1]["step"] / 2
    mean_value = statistics.fmean(r[key] for r in trace if r["step"] >= from_step)
    return trend(trace, key, from_step) / mean_value if mean_value else float("nan")


def summarize_trace(trace: list[dict[str, float]], norm_keys: tuple[str, ...]) -> dict[str, float]:
    """Start and end values, growth of each norm, and the change of the gap."""
    first, last = trace[0], trace[-1]
    summary: dict[str, float] = {}
    for key in norm_keys:
        summary[f"{key}_start"], summary[f"{key}_end"] = first[key], last[key]
        summary[f"{key}_growth"] = relative_growth(trace, key)
    for key in ("train_rmse", "test_rmse", "test_relative_l2", "gap"):
        summary[f"{key}_start"], summary[f"{key}_end"] = first[key], last[key]
    # The trend, not last - first: the gap on 50 test fields is noisy from one record to the next.
    summary["gap_change"] = trend(trace, "gap")
    return summary


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def _cell(values: list[float], digits: int = 4) -> str:
    """One value, or mean ± standard deviation over seeds."""
    if len(values) == 1 or not all(math.isfinite(v) for v in values):
        return " / ".join(f"{v:.{digits}g}" for v in values)
    return f"{_mean(values):.{digits}g} ± {statistics.stdev(values):.2g}"


def claims_and_tables(config: Any, runs: dict[str, list[dict[str, Any]]]) -> tuple[list[Claim], dict[str, list[dict[str, Any]]], dict[str, Any]]:  # fmt: skip
    """Per experiment and variant: summaries over seeds, the tables, and the claims' verdicts."""
    summary: dict[str, dict[str, dict[str, list[float]]]] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    for experiment, seed_runs in runs.items():
        keys = NORM_KEYS[experiment]
        summary[experiment] = {}
        rows = []
        for variant in config.variants:
            per_seed = [summarize_trace(run["traces"][variant], keys) for run in seed_runs]
            merged = {name: [s[name] for s in per_seed] for name in per_seed[0]}
            merged["lam"] = [run["lam"][variant] for run in seed_runs]
            summary[experiment][variant] = merged
            row: dict[str, Any] = {"variant": variant, "lam": _cell(merged["lam"], 3)}
            for key in keys:
                label = NORM_LABELS[key]
                row[f"{label} start"] = _cell(merged[f"{key}_start"])
                row[f"{label} end"] = _cell(merged[f"{key}_end"])
                row[f"{label} growth"] = _cell(merged[f"{key}_growth"], 3)
            for key, label in (("train_rmse", "train RMSE"), ("test_rmse", "test RMSE"),
                               ("test_relative_l2", "test rel. L2"), ("gap", "gap")):  # fmt: skip
                row[f"{label} end"] = _cell(merged[f"{key}_end"])
            row["gap trend"] = _cell(merged["gap_change"], 3)
            rows.append(row)
        title = (
            "W_Q, W_K under Langevin"
            if experiment == "attention"
            else "LoRA factors under Langevin"
        )
        tables[f"{title} (phase 2; {len(seed_runs)} seed(s))"] = rows
    villani = runs["attention"][0].get("villani", {})
    if villani:
        rows = []
        for variant, points in villani.items():
            row = {"variant": variant}
            for multiple, point in zip(config.villani_radii, points, strict=True):
                row[f"r = {multiple:g} x ||W||"] = f"{point['villani']:.4g}"
            rows.append(row)
        tables[
            "Villani quantity ||grad V||^2 / s - Laplacian V along the ray through the final (W_Q, W_K) (seed 0)"
        ] = rows
    claims = _claims(config, summary)
    return claims, tables, _json_summary(summary)


def _json_summary(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        e: {v: {k: list(x) for k, x in d.items()} for v, d in variants.items()}
        for e, variants in summary.items()
    }


def _claims(config: Any, summary: dict[str, Any]) -> list[Claim]:
    decide = config.mode != "smoke"
    growth, tolerance = config.growth_threshold, config.accuracy_tolerance
    regularized = [v for v in ("log", "power") if v in config.variants]
    claims = []
    for experiment, what in (("attention", "W_Q and W_K"), ("lora", "the LoRA factors A and B")):
        data = summary[experiment]
        keys = NORM_KEYS[experiment][:2]

        def grow(variant: str, key: str, data: dict[str, Any] = data) -> float:
            return _mean(data[variant][f"{key}_growth"])

        bounded = [
            f"{v}: " + ", ".join(f"{NORM_LABELS[k]} {grow(v, k):+.1%}" for k in keys)
            for v in regularized
        ]
        ok = all(grow(v, k) < growth for v in regularized for k in keys)
        claims.append(Claim(
            f"{experiment}: with a light log or power regularizer, the norms of {what} stay bounded",
            ok if decide else None,
            f"growth over the second half of phase 2 ({'; '.join(bounded)}); bounded means < {growth:.0%}."))  # fmt: skip
        if "none" in config.variants:
            unbounded = ", ".join(f"{NORM_LABELS[k]} {grow('none', k):+.1%}" for k in keys)
            ends = "; ".join(f"{v}: " + ", ".join(f"{NORM_LABELS[k]} {_mean(data[v][f'{k}_end']):.3g}" for k in keys)
                             for v in config.variants)  # fmt: skip
            claims.append(Claim(
                f"{experiment}: without a regularizer, the norms of {what} grow",
                all(grow("none", k) > growth for k in keys) if decide else None,
                f"growth without regularizer: {unbounded} (grows means > {growth:.0%}); end norms {ends}."))  # fmt: skip
            start = _mean(data["none"]["test_rmse_start"])
            change = {v: _mean(data[v]["gap_change"]) for v in config.variants}
            creeps = change["none"] > config.gap_threshold * start and all(
                change["none"] > change[v] for v in regularized
            )
            claims.append(Claim(
                f"{experiment}: without a regularizer, the generalization gap creeps up",
                creeps if decide else None,
                "gap trend over phase 2 (least-squares change): " + ", ".join(f"{v} {c:+.4f}" for v, c in change.items())
                + f" (creeps up means > {config.gap_threshold:.0%} of the starting test RMSE {start:.4f}, and more than with a regularizer)."))  # fmt: skip
            final = {v: _mean(data[v]["test_rmse_end"]) for v in config.variants}
            same = all(
                abs(final[v] - final["none"]) <= tolerance * final["none"] for v in regularized
            )
            claims.append(Claim(
                f"{experiment}: prediction accuracy is about the same with or without a regularizer",
                same if decide else None,
                "final test RMSE: " + ", ".join(f"{v} {r:.4f}" for v, r in final.items())
                + f" (the same means within {tolerance:.0%} of the unregularized run)."))  # fmt: skip
    return claims


def plot_traces(runs: dict[str, list[dict[str, Any]]], out_dir: Path) -> list[str]:
    """One 2x2 figure per experiment: norms, RMSE, relative L2, gap against the step."""
    names = []
    for experiment, seed_runs in runs.items():
        figure = Figure(figsize=(11, 7.5))
        axes = figure.subplots(2, 2)
        for variant in seed_runs[0]["traces"]:
            color = COLORS.get(variant, "black")
            traces = [run["traces"][variant] for run in seed_runs]
            steps = [r["step"] for r in traces[0]]
            for style, key in zip(STYLES, NORM_KEYS[experiment], strict=False):
                _band(
                    axes[0, 0], steps, traces, key, color, style, f"{NORM_LABELS[key]} ({variant})"
                )
            _band(axes[0, 1], steps, traces, "test_rmse", color, "-", f"test ({variant})")
            _band(axes[0, 1], steps, traces, "train_rmse", color, ":", f"train ({variant})")
            _band(axes[1, 0], steps, traces, "test_relative_l2", color, "-", variant)
            _band(axes[1, 1], steps, traces, "gap", color, "-", variant)
        for axis, title in zip(axes.flat, ("Frobenius norms", "RMSE", "test relative L2 error",
                                           "generalization gap (test - train RMSE)"), strict=True):  # fmt: skip
            axis.set_title(title)
            axis.set_xlabel("Langevin step")
            axis.legend(fontsize=7)
        label = "W_Q, W_K" if experiment == "attention" else "LoRA factors on q/k (depth 2)"
        figure.suptitle(f"Langevin on {label}, darcy-16 ({len(seed_runs)} seed(s); band = min-max)")
        figure.tight_layout()
        name = f"langevin_{experiment}.png"
        figure.savefig(out_dir / name, dpi=110)
        names.append(name)
    return names


def _band(axis: Any, steps: list[int], traces: list[list[dict[str, float]]], key: str, color: str,
          style: str, label: str) -> None:  # fmt: skip
    columns = [[trace[i][key] for trace in traces] for i in range(len(steps))]
    axis.plot(steps, [_mean(c) for c in columns], style, color=color, label=label)
    if len(traces) > 1:
        axis.fill_between(
            steps, [min(c) for c in columns], [max(c) for c in columns], color=color, alpha=0.15
        )
