"""Trace summaries of the `langevin` study's design 1 (its committed results are scored from
them by `langevin_claims_v1`); `trend` is also design 2's gap trend.

A design-1 trace is a list of records {step, <norm keys>, train_rmse, test_rmse, train_relative_l2,
test_relative_l2, gap, grad_rms}, one per evaluation during phase 2, for one variant and one
seed. grad_rms is the RMS of the last step's gradient of the potential over the trained
entries (None at step 0, before any step; absent in runs written before it was recorded).
"""

from __future__ import annotations

import statistics

NORM_KEYS = {"attention": ("query", "key"), "lora": ("lora_A", "lora_B", "lora_BA")}
NORM_LABELS = {
    "query": "||W_Q||",
    "key": "||W_K||",
    "lora_A": "||A||",
    "lora_B": "||B||",
    "lora_BA": "||BA||",
}


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
