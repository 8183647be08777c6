"""The residual study's plain summary: written from the verdicts and numbers of its results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from convergent.studies import EXPLORATORY_SENTENCE, study_findings
from convergent.studies.framework import VERDICTS, claims_by_key, misstated_verdicts
from convergent.studies.residual import summary
from tests.conftest import copied

COMMITTED = Path(__file__).resolve().parents[2] / "docs/results/residual-full/results.json"
LINEAR = "residual.converges_linearly_"
SPEED = "residual.speeds_up_with_beta_"
RATE = "residual.rate_follows_sigma_ratio_"
TOO_LARGE = "the loss rose after the transient, so the step was too large for the theorem to apply"
FLOOR = "residual.sigma_min_kept_from_zero"
DEPTH = "residual.advantage_grows_with_depth"


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return json.loads(COMMITTED.read_text())


@pytest.fixture
def payload(committed: dict[str, Any]) -> dict[str, Any]:
    return copied(committed)


def _set(payload: dict[str, Any], name: str, verdict: str, effect: float, interval: list[float]):
    claim: dict[str, Any] = claims_by_key(payload)[name]  # type: ignore[assignment]
    claim.update(verdict=verdict, effect=effect, interval=interval)
    return claim


def _text(payload: dict[str, Any]) -> str:
    sentences = summary(payload)
    assert 3 <= len(sentences) <= 5
    assert misstated_verdicts(sentences, payload) == []
    return " ".join(sentence.text for sentence in sentences)


def test_the_committed_summary(committed):
    sentences = summary(committed)
    assert len(sentences) == 5
    assert misstated_verdicts(sentences, committed) == []
    # Every claim's verdict is stated by exactly one sentence.
    declared = [name for sentence in sentences for name in sentence.verdicts]
    assert sorted(declared) == sorted(claims_by_key(committed))
    scale, conditioning, speed, linear, depth = (sentence.text for sentence in sentences)
    assert "64 windows of 12 hours of weather-hourly, 5 seeds each" in scale
    assert "MiniLM cut or extended to 2, 6 and 10 layers" in scale
    assert "fell to 0.00019" in conditioning
    assert "log10 ratio 3.0 [2.7, 3.2], reproduced" in conditioning
    assert "a slope of only 0.19 [0.11, 0.26] at step size 0.01" in conditioning
    # Two untested regimes with their own reasons, each after its own "at".
    assert (
        "tested at tuned step sizes of 0.4-0.8, where 4 of 25 runs diverged and the checks 'the "
        "common loss band spans at "
        "least a factor 2' and 'step size within the theorem's condition' did not pass, and at "
        f"step size 0.1, where {TOO_LARGE} (untested)"
    ) in conditioning
    assert speed.startswith("A steady speed-up from residuals was not resolved here: not every")
    assert (
        "not every step up in beta clearly sped training up at step size 0.1 and step size 0.01, "
        "the slowest 0.96x [0.89, 1.0] and 1.0x [0.90, 1.1] (inconclusive)"
    ) in speed
    assert (
        "the speeds could not be compared at tuned step sizes of 0.4-0.8, where 4 of 25 runs "
        "diverged and the check 'the common loss band spans at least a factor 2' did not pass"
    ) in speed
    assert "fell from 0.8 at beta 0 to 0.4 at beta 1" in speed
    assert "beta 0.75 was the fastest (2.1x beta 0)" in speed
    assert "held at step size 0.01 (reproduced)" in linear
    assert (
        f"could not be tested at step size 0.1 and tuned step sizes of 0.4-0.8, where {TOO_LARGE}"
        in linear
    )
    assert "only with small steps (here 0.01, not 0.1 or more)" in linear
    assert (
        "(untested: without residuals at 6 and 10 layers the train loss stayed within 10%" in depth
    )
    assert "0.18 with residuals and 0.50 without" in depth


def test_the_study_registry_serves_this_summary_with_no_exploratory_note(committed):
    # The committed verdicts are design 3's tests on its own seeds (10-14).
    assert not any(claim.get("exploratory") for claim in committed["claims"])
    assert study_findings(committed) == summary(committed)
    exploratory = copied(committed)
    exploratory["claims"][0]["exploratory"] = True
    first, *rest = study_findings(exploratory)
    assert first.text == EXPLORATORY_SENTENCE and rest == summary(exploratory)


def test_a_bound_that_holds_at_step_size_0_1_moves_it_to_held(payload):
    before = _text(payload)
    name = f"{LINEAR}lr_0p1"
    claim = _set(payload, name, "reproduced", -0.001, [-0.002, 0.0])
    for check in claim["checks"]:
        check["passed"] = True
    after = _text(payload)
    assert "held at step size 0.01 (reproduced)" in before
    assert "held at step size 0.1 and step size 0.01 (reproduced)" in after
    assert f"could not be tested at tuned step sizes of 0.4-0.8, where {TOO_LARGE}" in after
    assert "here 0.1, not 0.4 or more" in after
    # The old sentences now misstate the flipped claim.
    assert misstated_verdicts(summary(json.loads(COMMITTED.read_text())), payload)


def test_a_bound_broken_within_the_step_condition_is_a_failure(payload):
    name = f"{LINEAR}lr_0p1"
    claim = _set(payload, name, "not reproduced", 0.17, [0.01, 0.33])
    for check in claim["checks"]:
        check["passed"] = True
    text = _text(payload)
    assert "failed at step size 0.1, where the log loss peaked 0.17 [0.010, 0.33]" in text
    assert "here 0.01, not 0.1 or more" in text


def test_every_speed_step_up_holding_gives_the_plain_advice(payload):
    for name in claims_by_key(payload):
        if name.startswith(SPEED):
            _set(payload, name, "reproduced", 0.05, [0.01, 0.1])
    text = _text(payload)
    assert "So use residuals (beta > 0): every step up in beta sped training up at step " in text
    assert "the slowest by 1.1x [1.0, 1.1], 1.1x [1.0, 1.1] and 1.1x [1.0, 1.1]" in text


def test_no_speed_up_at_one_step_size_changes_the_advice(payload):
    name = f"{SPEED}lr_0p01"
    _set(payload, name, "not reproduced", -0.1, [-0.2, -0.01])
    text = _text(payload)
    assert "So use residuals" not in text
    assert "Residuals bought no steady speed-up here: some step up in beta slowed" in text
    assert "some step up in beta slowed training down at step size 0.01" in text
    assert "the slowest to 0.90x [0.82, 0.99] (not reproduced)" in text


def test_a_reproduced_rate_is_stated_with_its_slope(payload):
    name = f"{RATE}lr_0p01"
    _set(payload, name, "reproduced", 0.8, [0.6, 1.0])
    text = _text(payload)
    assert "the speed followed (sigma_min/sigma_max)^2" in text
    assert "a slope of 0.80 [0.60, 1.0] at step size 0.01 (at least 0.5 needed)" in text


def test_an_untested_floor_says_which_check_failed(payload):
    claim = _set(payload, FLOOR, "untested", 0.2, [0.1, 0.3])
    claim["checks"][0]["passed"] = False
    text = _text(payload)
    assert "900 times higher" in _text(json.loads(COMMITTED.read_text()))
    assert "900 times higher" not in text
    assert "is untested (the check 'softmax collapses rank at beta = 0' did not pass)" in text


def test_a_reproduced_depth_claim_is_stated_as_such(payload):
    _set(payload, DEPTH, "reproduced", 0.01, [0.005, 0.02])
    text = _text(payload)
    assert "stays unknown" not in text
    assert "The residual advantage grew with depth (reproduced)" in text
    assert "0.010 [0.0050, 0.020]" in text


def test_without_depth_runs_it_says_depth_is_unknown(payload):
    payload["claims"] = [c for c in payload["claims"] if c["key"] != DEPTH]
    payload["data"]["depth_runs"] = []
    text = _text(payload)
    assert "MiniLM" not in text
    assert "Depth was not run" in text


@pytest.mark.parametrize("verdict", VERDICTS)
def test_every_verdict_of_every_claim_is_stated_as_held(committed, verdict):
    for index in range(len(committed["claims"])):
        payload = copied(committed)
        claim = payload["claims"][index]
        claim["verdict"] = verdict
        if verdict == "untested":
            claim["checks"][0]["passed"] = False
        sentences = summary(payload)
        assert 3 <= len(sentences) <= 5
        assert misstated_verdicts(sentences, payload) == [], claim["statement"]
        declared = [name for sentence in sentences for name in sentence.verdicts]
        assert sorted(declared) == sorted(claims_by_key(payload))


def test_no_small_step_advice_when_a_larger_step_held(payload):
    tuned = next(name for name in claims_by_key(payload) if name == f"{LINEAR}lr_tuned")
    _set(payload, tuned, "reproduced", -0.001, [-0.002, 0.0])
    text = _text(payload)
    assert "held at step size 0.01 and tuned step sizes of 0.4-0.8 (reproduced)" in text
    assert f"could not be tested at step size 0.1, where {TOO_LARGE}" in text
    assert "small steps" not in text


def test_a_depth_claim_untested_for_another_check_names_it(payload):
    claim = _set(payload, DEPTH, "untested", 0.0, [-0.04, 0.04])
    for run in payload["data"]["depth_runs"]:
        run["losses"] = [0.3] * len(run["losses"])  # every arm far from chance
    claim["checks"][0]["passed"], claim["checks"][1]["passed"] = False, True
    text = _text(payload)
    assert "stays unknown (untested: the check 'beta = 1 runs trained' did not pass)" in text


@pytest.mark.parametrize(
    ("verdicts", "opener"),
    [
        (("reproduced",) * 3, "So use residuals (beta > 0): "),
        (("reproduced", "reproduced", "untested"), "where their speed could be measured: "),
        (("not reproduced", "untested", "untested"), "Residuals bought no steady speed-up here"),
        (("inconclusive",) * 3, "A steady speed-up from residuals was not resolved here"),
        (("untested",) * 3, "Whether residuals speed training up is untested here"),
        (("reproduced", "not reproduced", "untested"), "depended on the setting"),
        (("not reproduced", "inconclusive", "untested"), "bought no steady speed-up here"),
        (("reproduced", "inconclusive", "untested"), "steadily in some settings only"),
    ],
)
def test_the_speed_opener_follows_the_verdicts(payload, verdicts, opener):
    names = [name for name in claims_by_key(payload) if name.startswith(SPEED)]
    assert len(names) == 3
    for name, verdict in zip(names, verdicts, strict=True):
        _set(payload, name, verdict, 0.1, [0.05, 0.15])
    speed = next(
        s.text for s in summary(payload) if "step up in beta" in s.text or opener in s.text
    )
    assert opener in speed.partition(":")[0] + ": "
    assert misstated_verdicts(summary(payload), payload) == []
