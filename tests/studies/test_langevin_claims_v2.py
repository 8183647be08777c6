"""Design 2 of the langevin claims, on synthetic payloads whose answers are worked out here."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from convergent.studies import langevin_claims_v1 as v1
from convergent.studies.framework.common import json_ready
from convergent.studies.langevin_claims import (
    NOISE_CHECK,
    OVERFIT_CHECK,
    RUN_LENGTH_CHECK,
    claims_from_results,
    phase2_table,
    temperature_rows,
)

# The design-1 full results, as committed before design 2 replaced them.
COMMITTED = Path(__file__).resolve().parent / "data" / "langevin_design1_results.json"
LR = 0.01
S = {"hot": 0.01, "calibrated": 0.001, "cold": 1e-5, "zero": 0.0}
SEEDS = (0, 1, 2)
MATRICES = {
    "attention": ("blocks.0.attn.q_proj.weight", "blocks.0.attn.k_proj.weight"),
    "lora": (
        "blocks.0.attn.q_proj.lora_A.default.weight",
        "blocks.0.attn.q_proj.lora_B.default.weight",
        "blocks.1.attn.k_proj.lora_A.default.weight",
        "blocks.1.attn.k_proj.lora_B.default.weight",
    ),
}
NUMEL = 64
BOUND_STEPS, CLAIM_STEPS, EVERY = 2000, 1000, 100
RELAXATION = 200.0  # steps: the bound runs last 10 relaxation times
RADIUS = 2.0
GRAD_RMS = 2.0  # sqrt(lr s) / (lr * 2) = 0.5 at the hot s
LABELS_STD = 0.25
Norm = Callable[[str, int], float]


def start_norm(seed: int) -> float:
    return 1.0 + 0.1 * seed


def saturating(step: float, start: float, ceiling: float, tau: float = RELAXATION) -> float:
    """A norm relaxing to ``ceiling``: ceiling - (ceiling - start) exp(-step / tau)."""
    return ceiling - (ceiling - start) * math.exp(-step / tau)


def diffusing(step: float, start: float, s: float) -> float:
    """A matrix's norm under pure noise: sqrt(start^2 + numel s t), t = step * lr."""
    return math.sqrt(start**2 + NUMEL * s * step * LR)


# The synthetic study's answers, by seed: the log penalty's ceiling (fraction of r), the
# unregularized gap's rise over the run, the phase-1 test RMSE, the final test RMSEs.
def log_ceiling(seed: int) -> float:
    return 0.9 + 0.02 * seed


POWER_CEILING = 0.8


def gap_rise(variant: str, seed: int) -> float:
    return {"none": 0.04 + 0.01 * seed, "log": 0.002, "power": 0.001 * seed}[variant]


def pretrained_test(seed: int) -> float:
    return 0.5 + 0.05 * seed


def final_test(variant: str, seed: int) -> float:
    none = 0.6 + 0.01 * seed
    return {"none": none, "log": none * (1 + 0.01 * (seed + 1)), "power": none * 0.98}[variant]


def default_norm(variant: str, seed: int, temperature: str) -> Norm:
    """Pure diffusion without a regularizer; with one, a rise to a fraction of r at the hot
    temperature and a fall to half the start norm at the others."""
    start = start_norm(seed)
    if variant == "none" or S[temperature] == 0:
        return lambda matrix, step: diffusing(step, start, S[temperature])
    if temperature != "hot":
        return lambda matrix, step: saturating(step, start, start / 2)
    ceiling = (log_ceiling(seed) if variant == "log" else POWER_CEILING) * RADIUS
    return lambda matrix, step: saturating(step, start, ceiling)


def trace(steps: int, norm: Norm, matrices: tuple[str, ...], variant: str, seed: int) -> list:
    records = []
    for step in range(0, steps + 1, EVERY):
        gap = 0.1 + gap_rise(variant, seed) * step / steps
        test = final_test(variant, seed)
        records.append(
            {
                "step": step,
                "norms": {m: norm(m, step) for m in matrices},
                "train_rmse": test - gap,
                "validation_rmse": test,
                "test_rmse": test,
                "gap": gap,
                "grad_rms": None if step == 0 else GRAD_RMS,
            }
        )
    return records


def record(experiment: str, temperature: str, variant: str, seed: int) -> dict[str, Any]:
    s = S[temperature]
    steps = BOUND_STEPS if temperature == "hot" else CLAIM_STEPS
    matrices = MATRICES[experiment]
    plain = variant == "none" or s == 0
    return {
        "lam": 0.0 if variant == "none" else 0.5,
        "steps": steps,
        "relaxation_steps": math.nan if plain else RELAXATION,
        "stationary_radius": {m: math.inf if plain else RADIUS for m in matrices},
        "numel": dict.fromkeys(matrices, NUMEL),
        "trace": trace(steps, default_norm(variant, seed, temperature), matrices, variant, seed),
    }


def payload(variants: tuple[str, ...] = ("none", "log", "power")) -> dict[str, Any]:
    config = {
        "langevin_lr": LR,
        "bound_tolerance": 0.1,
        "relaxation_multiple": 5.0,
        "growth_threshold": 0.05,
        "gap_margin": 0.02,
        "accuracy_margin": 0.05,
        "bound_temperature": "hot",
        "claim_temperature": "calibrated",
        "seeds": list(SEEDS),
        "variants": list(variants),
    }
    runs = {
        experiment: [
            {
                "seed": seed,
                "pretrained": {
                    "train_rmse": 0.3,
                    "validation_rmse": 0.45,
                    "test_rmse": pretrained_test(seed),
                },
                "phase2": {t: {v: record(experiment, t, v, seed) for v in variants} for t in S},
            }
            for seed in SEEDS
        ]
        for experiment in MATRICES
    }
    data = {
        "design": 2,
        "regime": {
            "name": "200 fields, d_model 16",
            "train_fields": 200,
            "d_model": 16,
            "overfit_ratio": 1.4,
            "overfit_required": 1.25,
        },
        "labels_std": LABELS_STD,
        "temperatures": dict(S),
        "noise_variance": 0.01,
        "runs": runs,
    }
    return {"config": config, "data": data}


def by_name(claims: list, experiment: str) -> dict[str, Any]:
    """The claims of one experiment, keyed by their role."""
    mine = [c for c in claims if c.statement.startswith(f"{experiment}:")]
    keys = {
        "stay bounded": "bounded",
        "norms of": "grows",
        "does not creep up": "gap bounded",
        "creeps up": "gap creeps",
        "accuracy": "accuracy",
    }
    named = {}
    for claim in mine:
        key = next(k for k in keys if k in claim.statement)
        named[keys[key]] = claim
    return named


def set_norms(data: dict, experiment: str, temperature: str, variant: str, norm: Norm) -> None:
    for run in data["runs"][experiment]:
        for r in run["phase2"][temperature][variant]["trace"]:
            r["norms"] = {m: norm(m, r["step"]) for m in r["norms"]}


def total(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values))


def test_a_payload_whose_claims_hold_is_reproduced_with_values_worked_out_here():
    results = payload()
    claims = claims_from_results(results)
    assert len(claims) == 10
    for experiment, matrices in MATRICES.items():
        named = by_name(claims, experiment)
        assert list(named) == ["bounded", "grows", "gap bounded", "gap creeps", "accuracy"]
        assert all("(here:" in c.statement for c in named.values())
        count = len(matrices)
        # 1: the log run's ceiling is the largest fraction of r; the fit recovers it exactly.
        assert named["bounded"].per_seed == pytest.approx(
            [log_ceiling(seed) - 1 for seed in SEEDS], abs=1e-6
        )
        run_length, acted, noise = named["bounded"].checks
        assert run_length.name == RUN_LENGTH_CHECK
        assert run_length.value == pytest.approx(BOUND_STEPS / RELAXATION)
        none_end = [
            math.sqrt(count) * diffusing(BOUND_STEPS, start_norm(seed), S["hot"]) for seed in SEEDS
        ]
        ratios = {
            name: np.mean(
                [
                    math.sqrt(count)
                    * saturating(BOUND_STEPS, start_norm(seed), f(seed) * RADIUS)
                    / none_end[seed]
                    for seed in SEEDS
                ]
            )
            for name, f in (("log", log_ceiling), ("power", lambda seed: POWER_CEILING))
        }
        assert acted.value == pytest.approx(max(ratios.values()), rel=1e-12)
        assert noise.name == NOISE_CHECK
        assert noise.value == pytest.approx(math.sqrt(LR * S["hot"]) / (LR * GRAD_RMS))
        # 2: pure diffusion: end / start = sqrt(1 + numel s t / start^2) for every matrix.
        time = BOUND_STEPS * LR
        assert named["grows"].per_seed == pytest.approx(
            [math.sqrt(1 + NUMEL * S["hot"] * time / start_norm(s) ** 2) - 1 for s in SEEDS]
        )
        assert named["grows"].extra["observed_over_diffusion"] == pytest.approx([1.0] * 3)
        # 3 and 4: linear gaps, so the least-squares trend is the rise itself.
        assert named["gap bounded"].per_seed == pytest.approx(
            [max(gap_rise("log", s), gap_rise("power", s)) / pretrained_test(s) for s in SEEDS]
        )
        assert named["gap creeps"].per_seed == pytest.approx(
            [gap_rise("none", s) / pretrained_test(s) for s in SEEDS]
        )
        assert [c.name for c in named["gap creeps"].checks] == [OVERFIT_CHECK, NOISE_CHECK]
        assert named["gap creeps"].checks[0].value == 1.4
        # The regularizers' norms fall to half the start at the claim temperature.
        claim_acted = named["accuracy"].checks[0]
        halved = [saturating(CLAIM_STEPS, start_norm(s), start_norm(s) / 2) for s in SEEDS]
        diffused = [diffusing(CLAIM_STEPS, start_norm(s), S["calibrated"]) for s in SEEDS]
        assert claim_acted.value == pytest.approx(np.mean(np.divide(halved, diffused)))
        assert named["gap bounded"].checks[1].value == claim_acted.value
        # 5: the worse of log (+1 %, +2 %, +3 %) and power (-2 %).
        assert named["accuracy"].per_seed == pytest.approx([0.01, 0.02, 0.03])
        assert named["accuracy"].threshold.bounds == (-math.inf, 0.05)
        assert named["accuracy"].interval_method.startswith(
            "95 % Student-t interval over the paired"
        )
        none_mean = np.mean([final_test("none", s) for s in SEEDS])
        assert (
            f"none {none_mean:.4g} ({none_mean * LABELS_STD:.4g} raw)" in named["accuracy"].evidence
        )
        for claim in named.values():
            assert claim.verdict == "reproduced", claim.statement
            assert claim.n == 3 and not claim.preview


def test_a_norm_above_the_stationary_radius_is_not_bounded():
    results = payload()
    q = MATRICES["attention"][0]
    for run in results["data"]["runs"]["attention"]:
        start = start_norm(run["seed"])
        for r in run["phase2"]["hot"]["power"]["trace"]:
            r["norms"][q] = saturating(r["step"], start, 1.2 * RADIUS)
    named = by_name(claims_from_results(results), "attention")
    assert named["bounded"].per_seed == pytest.approx([0.2] * 3, abs=1e-6)
    assert named["bounded"].verdict == "not reproduced"


def test_a_norm_still_rising_at_the_end_is_caught_by_its_fitted_asymptote():
    results = payload()
    slow = 4 * BOUND_STEPS  # four times the run: the norm has risen only 22 % of the way
    set_norms(
        results["data"],
        "attention",
        "hot",
        "log",
        lambda matrix, step: saturating(step, 1.0, 1.5 * RADIUS, tau=slow),
    )
    peak = saturating(BOUND_STEPS, 1.0, 1.5 * RADIUS, tau=slow) / RADIUS
    assert peak - 1 < 0.1  # the peak alone would pass
    named = by_name(claims_from_results(results), "attention")
    assert named["bounded"].per_seed == pytest.approx([0.5] * 3, abs=1e-4)
    assert named["bounded"].verdict == "not reproduced"


def test_a_norm_falling_to_below_the_radius_is_judged_by_its_peak():
    # From 1.8 r down towards 0.6 r: the rising-curve fit of a falling norm has an asymptote
    # interval up to ~1e7, which must not make a shrinking norm "unbounded".
    results = payload()
    set_norms(
        results["data"],
        "attention",
        "hot",
        "log",
        lambda matrix, step: saturating(step, 1.8 * RADIUS, 0.6 * RADIUS, tau=300.0),
    )
    named = by_name(claims_from_results(results), "attention")
    # The second half starts at step 1000; the peak there is the value at 1000.
    log_peak = saturating(BOUND_STEPS / 2, 1.8 * RADIUS, 0.6 * RADIUS, tau=300.0) / RADIUS
    # The power runs still rise to 0.8 r, the larger of the two.
    expected = max(log_peak - 1, POWER_CEILING - 1)
    assert log_peak < POWER_CEILING
    assert named["bounded"].per_seed == pytest.approx([expected] * 3, abs=2e-3)
    assert named["bounded"].verdict == "reproduced"


def test_the_peak_is_taken_over_the_second_half_and_an_unfittable_curve_uses_it_alone():
    results = payload()
    # Three evaluations cannot be fitted (a floor, an amplitude and a decay need four): the
    # early high norm at step 0 is outside the second half and does not count.
    for run in results["data"]["runs"]["attention"]:
        for variant in ("log", "power"):
            hot = run["phase2"]["hot"][variant]
            hot["trace"] = [
                {**hot["trace"][0], "step": step, "norms": dict.fromkeys(hot["numel"], value)}
                for step, value in ((0, 1.5 * RADIUS), (1000, 0.7 * RADIUS), (2000, 0.75 * RADIUS))
            ]
    named = by_name(claims_from_results(results), "attention")
    assert named["bounded"].per_seed == pytest.approx([-0.25] * 3)
    assert "saturation fit failed for 12 of 12" in named["bounded"].evidence


def test_a_flat_norm_is_judged_by_its_peak_and_the_evidence_says_so():
    results = payload()
    set_norms(results["data"], "lora", "hot", "power", lambda matrix, step: 0.5 * RADIUS)
    named = by_name(claims_from_results(results), "lora")
    assert "saturation fit failed for 12 of 24 (seed, matrix) curves" in named["bounded"].evidence
    assert named["bounded"].per_seed == pytest.approx([log_ceiling(s) - 1 for s in SEEDS], abs=1e-6)


def test_claims_that_fail_in_the_data_are_not_reproduced():
    results = payload()
    data = results["data"]
    set_norms(data, "attention", "hot", "none", lambda matrix, step: 1.0)
    for run in data["runs"]["attention"]:
        calibrated = run["phase2"]["calibrated"]
        for r in calibrated["none"]["trace"]:
            r["gap"] = 0.1  # flat: no creep
        for r in calibrated["log"]["trace"]:
            r["test_rmse"] = 1.2 * final_test("none", run["seed"])
    named = by_name(claims_from_results(results), "attention")
    assert named["grows"].per_seed == pytest.approx([0.0] * 3)
    assert named["gap creeps"].per_seed == pytest.approx([0.0] * 3)
    assert named["accuracy"].per_seed == pytest.approx([0.2] * 3)
    for role in ("grows", "gap creeps", "accuracy"):
        assert named[role].verdict == "not reproduced", role


def _checks(claim) -> dict[str, bool | None]:
    return {c.name.split(" (")[0].split(",")[0]: c.passed for c in claim.checks}


def test_a_failed_check_makes_its_claims_untested():
    # The log runs are too short: two relaxation times (power's last ten).
    short = payload()
    for run in short["data"]["runs"]["attention"]:
        run["phase2"]["hot"]["log"]["relaxation_steps"] = BOUND_STEPS / 2
    named = by_name(claims_from_results(short), "attention")
    assert named["bounded"].checks[0].value == pytest.approx(2.0)
    assert named["bounded"].verdict == "untested"
    assert named["grows"].verdict == "reproduced"
    # The noise is a twentieth of the drift: plain SGD.
    quiet = payload()
    for run in quiet["data"]["runs"]["lora"]:
        for r in run["phase2"]["hot"]["none"]["trace"][1:]:
            r["grad_rms"] = 10 * GRAD_RMS
    named = by_name(claims_from_results(quiet), "lora")
    assert named["grows"].checks[0].value == pytest.approx(0.05)
    assert [named[r].verdict for r in ("bounded", "grows", "gap creeps")] == [
        "untested",
        "untested",
        "reproduced",
    ]
    # The regime cannot overfit: the gap claims are untested, accuracy is not.
    rigid = payload()
    rigid["data"]["regime"]["overfit_ratio"] = 1.1
    named = by_name(claims_from_results(rigid), "attention")
    assert [named[r].verdict for r in ("gap bounded", "gap creeps", "accuracy")] == [
        "untested",
        "untested",
        "reproduced",
    ]
    # The regularizer did not act at the claim temperature: the unregularized norm falls as far.
    idle = payload()
    for run in idle["data"]["runs"]["attention"]:
        calibrated = run["phase2"]["calibrated"]
        for without, with_power in zip(
            calibrated["none"]["trace"], calibrated["power"]["trace"], strict=True
        ):
            without["norms"] = dict(with_power["norms"])
    named = by_name(claims_from_results(idle), "attention")
    acted = named["accuracy"].checks[0]
    assert acted.value == pytest.approx(1.0) and acted.passed is False
    assert [named[r].verdict for r in ("gap bounded", "gap creeps", "accuracy")] == [
        "untested",
        "reproduced",
        "untested",
    ]


def test_a_payload_of_design_1_is_scored_by_design_1():
    committed = json.loads(COMMITTED.read_text())
    assert "design" not in committed["data"]
    claims = [c.to_json() for c in claims_from_results(committed)]
    assert claims == [c.to_json() for c in v1.claims_from_results(committed)]
    assert claims == committed["claims"]
    # A payload that says design 1 (or any other) goes the same way.
    other = copy.deepcopy(committed)
    other["data"]["design"] = 1
    assert [c.to_json() for c in claims_from_results(other)] == claims


def test_claims_whose_variant_or_temperature_did_not_run_are_left_out():
    alone = by_name(claims_from_results(payload(variants=("none",))), "attention")
    assert list(alone) == ["grows", "gap creeps"]
    unregularized = claims_from_results(payload(variants=("log", "power")))
    named = by_name(unregularized, "lora")
    assert list(named) == ["bounded", "gap bounded"]
    # Without an unregularized run "the regularizer acted" and "the noise acted" are unmeasured.
    assert [c.passed for c in named["bounded"].checks] == [True, None, None]
    assert all(c.verdict == "untested" for c in unregularized)
    results = payload()
    del results["data"]["temperatures"]["hot"]
    for runs in results["data"]["runs"].values():
        for run in runs:
            del run["phase2"]["hot"]
    named = by_name(claims_from_results(results), "attention")
    assert list(named) == ["gap bounded", "gap creeps", "accuracy"]
    # A variant in the config but not in every seed's runs is left out too.
    results = payload()
    del results["data"]["runs"]["lora"][1]["phase2"]["calibrated"]["power"]
    named = by_name(claims_from_results(results), "lora")
    assert named["accuracy"].per_seed == pytest.approx([0.01, 0.02, 0.03])
    assert "power" not in named["accuracy"].extra["relative_difference"]


def _nulls(value: Any) -> Any:
    """What another JSON writer makes of inf and NaN: null."""
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def test_inf_and_nan_stored_as_strings_or_null_score_the_same():
    results = payload()
    expected = [c.to_json() for c in claims_from_results(results)]
    as_strings = json.loads(json.dumps(json_ready(results)))
    assert (
        as_strings["data"]["runs"]["attention"][0]["phase2"]["hot"]["none"]["stationary_radius"][
            MATRICES["attention"][0]
        ]
        == "inf"
    )
    as_nulls = json.loads(json.dumps(_nulls(results)))
    assert as_nulls["data"]["runs"]["lora"][0]["phase2"]["hot"]["none"]["relaxation_steps"] is None
    for stored in (as_strings, as_nulls):
        assert [c.to_json() for c in claims_from_results(stored)] == expected


def test_phase2_table_rows_are_means_over_seeds():
    data = payload()["data"]
    rows = phase2_table(data, LR)
    assert len(rows) == 2 * 4 * 3  # experiments x temperatures x variants
    row = next(
        r
        for r in rows
        if (r["experiment"], r["temperature"], r["variant"]) == ("lora", "calibrated", "log")
    )
    finals = [final_test("log", s) for s in SEEDS]
    trains = [final_test("log", s) - 0.1 - gap_rise("log", s) for s in SEEDS]
    assert row["seeds"] == 3 and row["lam"] == 0.5 and row["s"] == S["calibrated"]
    assert row["test RMSE"] == pytest.approx(np.mean(finals))
    assert row["train RMSE"] == pytest.approx(np.mean(trains))
    assert row["test RMSE (raw)"] == pytest.approx(np.mean(finals) * LABELS_STD)
    assert row["train RMSE (raw)"] == pytest.approx(np.mean(trains) * LABELS_STD)
    assert row["test RMSE / phase-1 test RMSE"] == pytest.approx(
        np.mean([final_test("log", s) / pretrained_test(s) for s in SEEDS])
    )
    ends = [total([saturating(CLAIM_STEPS, start_norm(s), start_norm(s) / 2)] * 4) for s in SEEDS]
    assert row["total end norm"] == pytest.approx(np.mean(ends))
    assert row["noise / drift"] == pytest.approx(math.sqrt(LR * S["calibrated"]) / (LR * GRAD_RMS))
    zero = next(r for r in rows if r["temperature"] == "zero" and r["variant"] == "none")
    assert zero["noise / drift"] == 0.0 and zero["lam"] == 0.0
    # Without the step size there is no noise / drift column.
    assert all("noise / drift" not in r for r in phase2_table(data))


def test_temperature_rows_show_the_noise_variance_each_s_implies():
    rows = temperature_rows(payload()["data"], examples=200, outputs=256)
    assert [r["temperature"] for r in rows] == list(S)
    for row in rows:
        s = S[row["temperature"]]
        assert row["s"] == s and row["s / 2 (loss units)"] == s / 2
        # sigma^2 = s N K / 4, the inverse of s = 4 sigma^2 / (N K).
        assert row["implied noise variance"] == pytest.approx(s * 200 * 256 / 4)
        assert row["calibrated noise variance"] == 0.01
