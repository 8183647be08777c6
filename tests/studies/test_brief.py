"""The README's results page: each study's summary is short and states only held verdicts;
the "What to use" rows count their evidence's verdicts; each report states per claim the
smallest effect its design resolves (STUDIES.md rule 9)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from convergent.studies import study_advice, study_summary
from convergent.studies.framework import misstated_verdicts
from convergent.studies.framework.advice import (
    WORDS_PER_BRIEF,
    Advice,
    advice_lines,
    evidence_counts,
    verdict_words,
    word_count,
)
from convergent.studies.framework.resolution import claim_resolution, resolution_lines

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
PAYLOADS = sorted(RESULTS.glob("*/results.json"))


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: p.parent.name)
def test_each_readme_summary_is_short_action_first_and_states_held_verdicts(path):
    payload = json.loads(path.read_text())
    sentences = study_summary(payload)
    text = " ".join(sentence.text for sentence in sentences)
    assert word_count(text) <= WORDS_PER_BRIEF, text
    assert misstated_verdicts(sentences, payload) == []
    declared = {key for sentence in sentences for key in sentence.verdicts}
    assert declared == {claim["key"] for claim in payload["claims"]}  # every claim is covered


def _record(key: str, verdict: str) -> dict:
    return {"key": key, "verdict": verdict}


def test_evidence_is_counted_by_verdict():
    payload = {
        "name": "toy",
        "claims": [
            _record("toy.a", "reproduced"),
            _record("toy.b", "untested"),
            _record("toy.c", "reproduced"),
            _record("toy.d", "inconclusive"),
        ],
    }
    assert (
        evidence_counts(payload, ["toy.a", "toy.b", "toy.c"]) == "2 reproduced, 1 untested (of 3)"
    )
    assert verdict_words(["untested", "reproduced", "untested"]) == "1 reproduced and 2 untested"
    assert verdict_words(["reproduced", "reproduced"]) == "reproduced"
    row = Advice("Toy", "always", "x = 1 (unitless)", ("toy.a", "toy.d"), "nothing")
    lines = advice_lines([(payload, row)])
    assert lines[-2] == (
        "| Toy (`toy`) | always | x = 1 (unitless) | no claim: nothing is recommended on this "
        "evidence | 1 reproduced, 1 inconclusive (of 2) | nothing |"
    )
    with pytest.raises(KeyError, match=r"toy\.gone"):
        evidence_counts(payload, ["toy.gone"])


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: p.parent.name)
def test_the_committed_advice_counts_the_committed_verdicts(path):
    payload = json.loads(path.read_text())
    verdicts = {claim["key"]: claim["verdict"] for claim in payload["claims"]}
    for row in study_advice(payload):
        counted = evidence_counts(payload, row.evidence)
        for verdict in set(verdicts[key] for key in row.evidence):
            count = sum(verdicts[key] == verdict for key in row.evidence)
            assert f"{count} {verdict}" in counted


def _claim(per_seed, form, value, extra=None):
    return {
        "key": "toy.claim",
        "unit": "u",
        "n": len(per_seed),
        "per_seed": per_seed,
        "effect": sum(per_seed) / len(per_seed),
        "threshold": {"form": form, "value": value},
        **({"extra": extra} if extra else {}),
    }


def test_the_resolution_is_the_t_half_width_and_the_seeds_it_needs():
    # SD 1, 3 seeds: t(0.975, 2) = 4.303 (t table), so 4.303 / sqrt(3) = 2.484; the effect,
    # 2, lies 2 from the threshold 0: not resolved. At 4 seeds t(0.975, 3) / 2 = 3.182 / 2 =
    # 1.591 < 2, at 3 it is not: 4 seeds resolve it.
    found = claim_resolution(_claim([1.0, 2.0, 3.0], ">=", 0.0))
    assert found.half_width == pytest.approx(4.303 / math.sqrt(3), rel=1e-3)
    assert found.distance == 2.0 and not found.resolved and found.seeds_needed == 4
    assert claim_resolution(_claim([1.0, 2.0, 3.0], "<=", -3.0)).resolved  # 5 away
    # A two-sided margin narrower than the half-width can never show equivalence.
    narrow = claim_resolution(_claim([1.0, 2.0, 3.0], "within", [1.0, 3.0]))
    assert narrow.margin_too_narrow
    # A crossed interval's half-width is the one stored with the claim.
    stored = _claim([1.0, 2.0, 3.0], ">=", 0.0, {"resolution": {"half_width": 0.5}})
    assert claim_resolution(stored).half_width == 0.5 and claim_resolution(stored).resolved
    assert math.isnan(claim_resolution(_claim([1.0], ">=", 0.0)).half_width)


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: p.parent.name)
def test_each_t_interval_claims_resolution_is_its_intervals_half_width(path):
    claims = json.loads(path.read_text())["claims"]
    for claim in claims:
        if claim["interval"] is None or "resolution" in claim.get("extra", {}):
            continue
        low, high = claim["interval"]
        assert claim_resolution(claim).half_width == pytest.approx((high - low) / 2), claim["key"]
    rows = [line for line in resolution_lines(claims) if line.startswith("| `")]
    assert len(rows) == len(claims)
