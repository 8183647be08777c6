"""Design 1 of the langevin study (its committed results) and the helpers both designs use."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from convergent.optim.langevin import Langevin
from convergent.studies.langevin import gradient_rms
from convergent.studies.langevin_claims import (
    NOISE_CHECK,
    claims_from_results,
    noise_check,
    noise_to_drift_ratio,
)
from convergent.studies.langevin_report import relative_growth, trend

# The design-1 full results, as committed before design 2 replaced them.
COMMITTED = Path(__file__).resolve().parent / "data" / "langevin_design1_results.json"


def test_relative_growth_of_a_line_and_a_plateau():
    line = [{"step": step, "x": 1.0 + step / 100} for step in range(0, 101, 10)]
    # From 1.5 to 2.0 over the second half, around a mean of 1.75.
    assert relative_growth(line, "x") == pytest.approx(0.5 / 1.75)
    plateau = [{"step": step, "x": 3.0} for step in range(0, 101, 10)]
    assert relative_growth(plateau, "x") == 0.0
    zigzag = [
        {"step": step, "x": step / 100 + (0.3 if step % 20 else -0.3)} for step in range(0, 101, 10)
    ]
    assert trend(zigzag, "x") == pytest.approx(1.0, abs=0.15)  # the noise averages out


def test_gradient_rms_of_known_gradients():
    ones = torch.zeros(4, requires_grad=True)
    zeros = torch.zeros(3, 4, requires_grad=True)
    untouched = torch.zeros(5, requires_grad=True)  # no gradient: not counted
    ones.grad, zeros.grad = torch.full((4,), 3.0), torch.zeros(3, 4)
    # sqrt((4 * 9 + 12 * 0) / 16)
    assert gradient_rms([ones, zeros, untouched]) == pytest.approx(1.5)
    assert gradient_rms([untouched]) == 0.0


def test_noise_to_drift_ratio_matches_one_langevin_step():
    lr, s, entries = 0.01, 0.004, 200_000
    gradient = torch.randn(entries, generator=torch.Generator().manual_seed(1)) * 0.3

    def moved(noise: float) -> torch.Tensor:
        weight = torch.zeros(entries, requires_grad=True)
        weight.grad = gradient.clone()
        Langevin([weight], lr=lr, s=noise, seed=0).step()
        return weight.detach()

    drift = moved(0.0)
    noise = moved(s) - drift
    measured = float(noise.pow(2).mean().sqrt() / drift.pow(2).mean().sqrt())
    rms = float(gradient.pow(2).mean().sqrt())
    assert noise_to_drift_ratio(lr, s, rms) == pytest.approx(measured, rel=0.01)
    assert noise_to_drift_ratio(0.01, 0.0025, 0.5) == pytest.approx(1.0)  # 0.005 / 0.005
    assert noise_to_drift_ratio(0.01, 0.0025, 0.0) == math.inf
    with pytest.raises(ValueError, match="lr > 0"):
        noise_to_drift_ratio(0.0, 0.0025, 0.5)


def test_noise_check_averages_records_then_seeds_and_skips_step_zero():
    lr, s = 0.01, 0.0025  # sqrt(lr s) / lr = 0.5
    traces: list[list[dict[str, Any]]] = [
        [
            {"step": 0, "grad_rms": None},
            {"step": 10, "grad_rms": 1.0},
            {"step": 20, "grad_rms": 0.5},
        ],
        [
            {"step": 0, "grad_rms": None},
            {"step": 10, "grad_rms": 5.0},
            {"step": 20, "grad_rms": 5.0},
        ],
    ]
    check = noise_check(traces, lr, s)
    assert check.value == pytest.approx(((0.5 + 1.0) / 2 + 0.1) / 2)
    assert check.passed is True
    old = [[{"step": 0}, {"step": 10}]]
    missing = noise_check(old, lr, s)
    assert missing.value is None and missing.passed is None
    assert "gradient RMS not stored" in missing.note


def _gap_trend(trace: list[dict]) -> float:
    """Least-squares slope of the gap against the step, times the steps spanned."""
    steps = np.array([r["step"] for r in trace], dtype=float)
    slope = np.polyfit(steps, np.array([r["gap"] for r in trace]), 1)[0]
    return float(slope * (steps[-1] - steps[0]))


def _t_interval(values: list[float]) -> tuple[float, float]:
    n = len(values)
    half = stats.t.ppf(0.975, n - 1) * np.std(values, ddof=1) / math.sqrt(n)
    return float(np.mean(values) - half), float(np.mean(values) + half)


def test_committed_full_results_rescore_from_their_own_numbers():
    payload = json.loads(COMMITTED.read_text())
    claims = claims_from_results(payload)
    assert len(claims) == 8
    runs, summary = payload["data"]["runs"], payload["data"]["summary"]
    gap_bar, tolerance = payload["config"]["gap_threshold"], payload["config"]["accuracy_tolerance"]
    for index, (experiment, keys) in enumerate(
        (("attention", ("query", "key")), ("lora", ("lora_A", "lora_B")))
    ):
        bounded, grows, gap, accuracy = claims[4 * index : 4 * index + 4]
        assert all(c.statement.startswith(experiment) for c in (bounded, grows, gap, accuracy))
        assert "(here:" in bounded.statement and "stay bounded" in bounded.statement
        traces = [r["traces"] for r in runs[experiment]]
        # Claim 1 from the growth numbers the run itself stored in its summary.
        stored = summary[experiment]
        expected = [
            max(stored[v][f"{k}_growth"][seed] for v in ("log", "power") for k in keys)
            for seed in range(3)
        ]
        assert bounded.per_seed == pytest.approx(expected, rel=1e-9)
        # Claim 3 from the raw traces: the gap trend by numpy's least squares.
        expected = []
        for trace in traces:
            change = {v: _gap_trend(trace[v]) for v in ("none", "log", "power")}
            start = trace["none"][0]["test_rmse"]
            expected.append(
                min(
                    change["none"] - gap_bar * start,
                    change["none"] - max(change["log"], change["power"]),
                )
            )
        assert gap.per_seed == pytest.approx(expected, abs=1e-12)
        # Claim 4 from the last records: the variant furthest from the unregularized run.
        difference = {
            v: [
                (t[v][-1]["test_rmse"] - t["none"][-1]["test_rmse"]) / t["none"][-1]["test_rmse"]
                for t in traces
            ]
            for v in ("log", "power")
        }
        worst = max(difference, key=lambda v: np.mean(np.abs(difference[v])))
        assert accuracy.per_seed == pytest.approx(difference[worst], rel=1e-12)
        assert accuracy.threshold.bounds == (-tolerance, tolerance)
        # The intervals are Student-t intervals over the three seeds.
        for claim in (gap, accuracy):
            assert claim.n == 3 and not claim.preview
            assert claim.interval == pytest.approx(_t_interval(list(claim.per_seed)), rel=1e-9)
        # Check A from the end norms of all targeted matrices together.
        ratio = max(
            np.mean([
                math.hypot(*(t[v][-1][k] for k in keys)) / math.hypot(*(t["none"][-1][k] for k in keys))
                for t in traces
            ])
            for v in ("log", "power")
        )  # fmt: skip
        assert bounded.checks[0].value == pytest.approx(ratio, rel=1e-12)
        assert bounded.checks[0].passed is True
        # The gradient RMS was not stored then: the claims that need the noise check are untested.
        for claim in (grows, gap):
            assert claim.verdict == "untested"
            noise = next(c for c in claim.checks if c.name == NOISE_CHECK)
            assert noise.value is None and "gradient RMS not stored by this run" in noise.note
        for claim in (bounded, accuracy):
            assert claim.verdict != "untested"
    assert [c.verdict for c in claims] == [
        "not reproduced", "untested", "untested", "not reproduced",
        "not reproduced", "untested", "untested", "inconclusive",
    ]  # fmt: skip
