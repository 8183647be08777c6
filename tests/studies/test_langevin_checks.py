"""The langevin claims' noise and fit checks: "the noise changed the outcome against s = 0" (the
total norm for bounded and grows, the final test RMSE for the gap and accuracy claims) and
"phase 2 kept the phase-1 fit", with answers worked out here on the synthetic payload
(`langevin_payload`), and on the committed design-6 runs, where they fail at the cold
temperature that design 6's noise / gradient step ratio passed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from convergent.studies.langevin import claims_from_results
from convergent.studies.langevin.checks import (
    FIT_CHECK,
    NORM_CHECK,
    OUTCOME_CHECK,
    OVERFIT_CHECK,
    norm_moved_check,
    outcome_moved_check,
)
from convergent.studies.langevin.claims import experiments
from convergent.studies.langevin.measures import Experiment, mean_noise_ratio
from tests.studies.langevin_payload import (
    MATRICES,
    PHASE1_TRAIN,
    SEEDS,
    S,
    by_name,
    final_test,
    gap_rise,
    payload,
    pretrained_test,
    shift_rmse,
    start_norm,
)

CLAIM_TEMPERATURES = ("hot", "calibrated")
HISTORY = Path(__file__).resolve().parents[2] / "docs" / "results" / "langevin-full" / "history"


def unmoved(fit_kept: float = 2.0) -> dict[str, Any]:
    """The payload at two claim temperatures, every final RMSE the same as at s = 0."""
    return payload(claim_temperatures=CLAIM_TEMPERATURES, moved=0.0, fit_kept=fit_kept)


def shift_test_rmse(results: dict, temperature: str, variants: tuple[str, ...], by: float) -> None:
    """Move every evaluation's train, validation and test RMSE of ``variants`` at
    ``temperature`` by ``by`` x the seed's phase-1 test RMSE (the gap stays)."""
    for experiment in MATRICES:
        for run in results["data"]["runs"][experiment]:
            shift_rmse(run, temperature, variants, by * pretrained_test(run["seed"]))


def at(claims: list, temperature: str, experiment: str) -> dict[str, Any]:
    """One experiment's claims at ``temperature`` (bounded and grows are at the hot one)."""
    here = [c for c in claims if f"at the {temperature} temperature" in c.statement]
    return by_name(here, experiment)


def check(claim: Any, prefix: str) -> Any:
    (found,) = [c for c in claim.checks if c.name.startswith(prefix)]
    return found


def final_train(variant: str, seed: int) -> float:
    """The synthetic trace's train RMSE: test - gap, the gap at its end 0.1 + rise."""
    return final_test(variant, seed) - (0.1 + gap_rise(variant, seed))


def test_claims_at_every_claim_temperature_untested_where_the_noise_changed_nothing():
    claims = claims_from_results(unmoved())
    # bounded and grows once, then gap bounded, gap creeps and accuracy per claim temperature.
    assert len(claims) == 2 * (2 + 3 * len(CLAIM_TEMPERATURES))
    for experiment in MATRICES:
        for temperature in CLAIM_TEMPERATURES:
            named = at(claims, temperature, experiment)
            gap_claims = ("gap bounded", "gap creeps", "accuracy")
            assert set(gap_claims) <= set(named)
            # Every temperature's final test RMSE is that of s = 0 in this payload.
            for key in gap_claims:
                moved = check(named[key], OUTCOME_CHECK)
                assert moved.value == 0.0 and moved.passed is False
                assert named[key].verdict == "untested"
            assert [c.name for c in named["gap creeps"].checks] == [
                OVERFIT_CHECK,
                f"{OUTCOME_CHECK} (none)",
                f"{FIT_CHECK} (none)",
            ]
        # The bound and growth claims read the norm, which the noise moved, and hold.
        hot = at(claims, "hot", experiment)
        assert hot["bounded"].verdict == "reproduced" and hot["grows"].verdict == "reproduced"
        assert not any(c.name.startswith(OUTCOME_CHECK) for c in hot["bounded"].checks)
        assert check(hot["grows"], NORM_CHECK).passed is True


def test_a_moved_outcome_passes_the_check_and_the_fit_check_reads_the_train_rmse():
    results = unmoved(fit_kept=2.0)
    shift_test_rmse(results, "calibrated", ("none", "log", "power"), 0.02)
    claims = claims_from_results(results)
    for experiment in MATRICES:
        named = at(claims, "calibrated", experiment)
        for key in ("gap bounded", "gap creeps", "accuracy"):
            assert check(named[key], OUTCOME_CHECK).value == pytest.approx(0.02)
        # Fit kept: the largest over the variants read of the final train RMSE over phase 1's.
        shifted = {
            v: [final_train(v, s) + 0.02 * pretrained_test(s) for s in SEEDS]
            for v in ("none", "log", "power")
        }
        penalties = np.mean(
            [max(shifted["log"][i], shifted["power"][i]) / PHASE1_TRAIN for i in range(3)]
        )
        fit = check(named["gap bounded"], FIT_CHECK)
        assert fit.value == pytest.approx(penalties) and fit.passed
        alone = check(named["gap creeps"], FIT_CHECK)
        assert alone.value == pytest.approx(np.mean(shifted["none"]) / PHASE1_TRAIN)
        # With every check passed these gap and accuracy claims hold.
        assert named["gap bounded"].verdict == "reproduced"
        assert named["gap creeps"].verdict == "reproduced"
        assert named["accuracy"].verdict == "reproduced"
        # The hot runs were not moved: their claims stay untested.
        assert at(claims, "hot", experiment)["gap creeps"].verdict == "untested"


def test_every_variant_a_claim_reads_must_have_moved_and_kept_its_fit():
    results = unmoved(fit_kept=2.0)
    shift_test_rmse(results, "calibrated", ("none",), 0.03)
    claims = claims_from_results(results)
    for experiment in MATRICES:
        named = at(claims, "calibrated", experiment)
        assert check(named["gap creeps"], OUTCOME_CHECK).value == pytest.approx(0.03)
        assert named["gap creeps"].verdict == "reproduced"
        # log and power did not move: the smallest over the variants read is 0.
        for key in ("gap bounded", "accuracy"):
            assert check(named[key], OUTCOME_CHECK).value == 0.0
            assert named[key].verdict == "untested"
    # A fit that got worse by more than the allowed multiple gates the gap and accuracy claims.
    strict = unmoved(fit_kept=1.25)
    shift_test_rmse(strict, "calibrated", ("none", "log", "power"), 0.02)
    for experiment in MATRICES:
        named = at(claims_from_results(strict), "calibrated", experiment)
        for key in ("gap bounded", "gap creeps", "accuracy"):
            assert check(named[key], FIT_CHECK).value > 1.25
            assert named[key].verdict == "untested"


def test_the_norm_check_passes_where_the_noise_moved_the_norm_and_fails_where_it_did_not():
    results = payload()
    (experiment, _) = experiments(results["config"], results["data"])
    # The hot runs diffuse away from the s = 0 runs' constant norm: at step CLAIM_STEPS the
    # unregularized norm is sqrt(start^2 + numel s t) against the start.
    moved = norm_moved_check(experiment, "hot", ["none"], 0.01)
    expected = [math.sqrt(1 + 64 * S["hot"] * 1000 * 0.01 / start_norm(s) ** 2) - 1 for s in SEEDS]
    assert moved.value == pytest.approx(np.mean(expected)) and moved.passed is True
    # At the cold temperature s = 1e-5 the same diffusion moves it by about 0.3 %: it fails.
    cold = norm_moved_check(experiment, "cold", ["none"], 0.01)
    expected = [math.sqrt(1 + 64 * S["cold"] * 1000 * 0.01 / start_norm(s) ** 2) - 1 for s in SEEDS]
    assert cold.value == pytest.approx(np.mean(expected)) and cold.passed is False
    # Read at the s = 0 run's last step: a hot run without an evaluation there is unmeasured.
    for run in results["data"]["runs"]["attention"]:
        trace = run["phase2"]["hot"]["none"]["trace"]
        trace[:] = [r for r in trace if r["step"] != 1000]
    (experiment, _) = experiments(results["config"], results["data"])
    assert norm_moved_check(experiment, "hot", ["none"], 0.01).passed is None


def test_on_the_committed_design_6_runs_the_checks_fail_cold_and_pass_warm():
    # Design 6's noise check, sqrt(lr s) / (lr RMS grad), read at least 14 at the cold
    # temperature, where the gradient vanishes near the minimum: it could not fail. The checks
    # that replace it read the outcome against s = 0 and fail there.
    committed = json.loads((HISTORY / "design6.results.json").read_text())
    config, data = committed["config"], committed["data"]
    for experiment in experiments(config, data):
        none_runs = experiment.records("cold", "none")
        ratios = [
            mean_noise_ratio(r["trace"], experiment.lr, data["temperatures"]["cold"])
            for r in none_runs
        ]
        assert min(ratios) > 0.1  # the old check passes at the cold temperature
        all_variants = ["none", "log", "power"]
        for temperature, passed in (
            ("cold", False),
            ("calibrated", False),
            ("warm", True),
            ("hot", True),
        ):
            norm = norm_moved_check(experiment, temperature, all_variants, 0.01)
            outcome = outcome_moved_check(experiment, temperature, all_variants, 0.01)
            assert norm.passed is passed and outcome.passed is passed, (
                experiment.name,
                temperature,
            )


def _trace(values: dict[int, float]) -> list[dict[str, float]]:
    return [{"step": step, "test_rmse": value} for step, value in values.items()]


def test_the_outcome_check_compares_a_longer_run_with_s_zero_at_the_same_step():
    # The hot run lasts 12,000 steps, its s = 0 control 3,000. At step 3,000 the noise has
    # moved the test RMSE by 0.005 (0.5 % of the phase-1 1.0); by step 12,000 the longer run
    # has drifted to 1.3, which is time, not noise.
    hot = {"trace": _trace({1000: 1.0, 3000: 1.005, 12000: 1.3})}
    zero = {"trace": _trace({1000: 1.0, 3000: 1.0})}
    experiment = Experiment(
        "attention",
        "W_Q and W_K",
        [
            {
                "seed": 1,
                "pretrained": {"test_rmse": 1.0},
                "phase2": {"hot": {"none": hot}, "zero": {"none": zero}},
            }
        ],
        ["none"],
        {"hot": 0.02, "zero": 0.0},
        0.01,
    )
    found = outcome_moved_check(experiment, "hot", ["none"], 0.01)
    assert found.value == pytest.approx(0.005) and found.passed is False
    # A run without an evaluation at the control's last step is not compared at all.
    hot["trace"] = _trace({1000: 1.0, 12000: 1.3})
    assert math.isnan(outcome_moved_check(experiment, "hot", ["none"], 0.01).value)
