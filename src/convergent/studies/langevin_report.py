"""Tables, notes and figures of the `langevin` study, from its recorded traces.

A trace is a list of records {step, <norm keys>, train_rmse, test_rmse, train_relative_l2,
test_relative_l2, gap, grad_rms}, one per evaluation during phase 2, for one variant and one
seed. grad_rms is the RMS of the last step's gradient of the potential over the trained
entries (None at step 0, before any step; absent in runs written before it was recorded).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

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


def tables_and_summary(
    config: Any, runs: dict[str, list[dict[str, Any]]]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Per experiment and variant: the tables and the summaries over seeds (the claims are
    scored in `langevin_claims`, from the traces)."""
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
            for key, label in (
                ("train_rmse", "train RMSE"),
                ("test_rmse", "test RMSE"),
                ("test_relative_l2", "test rel. L2"),
                ("gap", "gap"),
            ):
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
    return tables, _json_summary(summary)


def _json_summary(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        e: {v: {k: list(x) for k, x in d.items()} for v, d in variants.items()}
        for e, variants in summary.items()
    }


def lam_note(config: Any, runs: dict[str, list[dict[str, Any]]]) -> str:
    """How lam was set, and its value and stationary radius per experiment (first seed)."""
    parts = []
    for experiment, seed_runs in runs.items():
        for variant in config.variants:
            if variant == "none":
                continue
            first = seed_runs[0]
            parts.append(
                f"{experiment}/{variant}: lam {first['lam'][variant]:.3g}, stationary "
                f"||W|| per matrix {first['stationary_radius'][variant]:.3g}"
            )
    if config.lam_rule == "radius":
        rule = (
            f"lam is set so that the penalty alone (flat loss) has its most likely ||W||_F at "
            f"{config.radius_factor:g}x the root-mean-square start norm of the targeted matrices"
        )
    else:
        rule = f"lam is set so that the penalty is {config.penalty_fraction:.0%} of the training loss at the start"
    return f"{rule}; seed {config.seeds[0]}: " + "; ".join(parts) + "."


def run_notes(
    config: Any, runs: dict[str, list[dict[str, Any]]], s: float, train_size: int
) -> list[str]:
    """The report's notes: the noise, lam, and how the claims' quantities are measured."""
    origin = (
        "2 / N_train, the posterior at temperature 1 for the summed loss"
        if config.s is None
        else "set in the config"
    )
    notes = [
        f"s = {s:.3g} (temperature s/2 = {s / 2:.3g}; {origin}), Langevin lr = "
        f"{config.langevin_lr}, batch {config.langevin_batch_size} of {train_size} training "
        "examples (stochastic-gradient Langevin), test = the 50 official test fields.",
        lam_note(config, runs),
        "The gap is test RMSE - train RMSE; RMSE is in units of the standardized solution field.",
        "Growth of a norm = its least-squares trend over the second half of phase 2, as a fraction "
        "of its mean there; the gap trend is the least-squares change of the gap over all of phase "
        "2. Norms in the tables are over all targeted matrices together (e.g. ||A|| over every "
        "LoRA A).",
        "Noise check: sqrt(lr s) / (lr * RMS of the gradient of loss + regularizer over the "
        "trained entries), the gradient read at every record step of phase 2.",
    ]
    if config.mode == "smoke":
        notes.append(
            "Smoke size: one seed, too short and too small to decide a claim; verdicts are previews."
        )
    return notes


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
        for axis, title in zip(
            axes.flat,
            (
                "Frobenius norms",
                "RMSE",
                "test relative L2 error",
                "generalization gap (test - train RMSE)",
            ),
            strict=True,
        ):
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


def _band(
    axis: Any,
    steps: list[int],
    traces: list[list[dict[str, float]]],
    key: str,
    color: str,
    style: str,
    label: str,
) -> None:
    columns = [[trace[i][key] for trace in traces] for i in range(len(steps))]
    axis.plot(steps, [_mean(c) for c in columns], style, color=color, label=label)
    if len(traces) > 1:
        axis.fill_between(
            steps, [min(c) for c in columns], [max(c) for c in columns], color=color, alpha=0.15
        )
