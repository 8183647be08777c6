"""The engine's claim record: its words filled from fields, its effect and interval the mean and
Student-t interval of the per-seed values (computed here with scipy), its overrides."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from convergent.studies.engine import ClaimSpec
from convergent.studies.framework import Check, at_least, at_most

SPEC = ClaimSpec(
    "toy.gain_{tag}",
    "At {top} the method gains (here: {where})",
    at_least(0.0),
    "gain at {top}",
    "per seed: {values}",
    "design 2: {why}",
    checks=("moved",),
    paired=True,
)
FIELDS = {"tag": "s90", "top": "90 %", "where": "toy data", "values": "1, 2, 3", "why": "new"}


def test_a_claim_fills_its_words_and_scores_its_seeds():
    values = [0.01, 0.03, 0.02, 0.05, 0.04]
    moved = Check("moved", 0.5, at_least(0.2))
    claim = SPEC.claim(values, [moved], extra={"n": 5}, **FIELDS)
    assert claim.extra == {"n": 5} and claim.checks == (moved,)
    assert "paired per-seed differences" in claim.interval_method  # declared paired
    assert claim.key == "toy.gain_s90"
    assert claim.statement == "At 90 % the method gains (here: toy data)"
    assert claim.unit == "gain at 90 %"
    assert claim.evidence == "per seed: 1, 2, 3"
    assert claim.revised == "design 2: new"
    mean = sum(values) / len(values)
    half = stats.t.ppf(0.975, len(values) - 1) * stats.sem(values)
    assert claim.effect is not None and math.isclose(claim.effect, mean, rel_tol=1e-12)
    assert claim.interval is not None
    low, high = claim.interval
    assert math.isclose(low, mean - half, rel_tol=1e-9)
    assert math.isclose(high, mean + half, rel_tol=1e-9)
    assert claim.verdict == "reproduced"  # the whole interval above 0, the check passed


def test_overrides_replace_the_declared_key_threshold_and_evidence():
    values = [0.01, 0.03, 0.02, 0.05, 0.04]
    claim = SPEC.claim(values, [], claim_key="toy.other", claim_threshold=at_most(0.0),
                       claim_evidence="computed", **FIELDS)  # fmt: skip
    assert claim.key == "toy.other"
    assert claim.evidence == "computed"
    assert claim.verdict == "not reproduced"  # the whole interval above the bound 0


def test_a_claim_without_a_threshold_names_itself():
    spec = ClaimSpec("toy.bound", "bounded", None, "excess")
    with pytest.raises(ValueError, match=r"toy\.bound declares no threshold"):
        spec.claim([0.1, 0.2], [])
