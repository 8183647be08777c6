"""A declared check (`engine.checks.CheckSpec`) against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from convergent.studies.engine.checks import CheckSpec
from convergent.studies.framework import at_least, at_most


def _spec(summary: str, finite: str = "all") -> CheckSpec:
    return CheckSpec("x", at_least(1.0), summary, "why", "nothing to read", finite)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "summary, readings, value, passed",
    [
        ("min", [3.0, 0.5, 2.0], 0.5, False),
        ("max", [3.0, 0.5], 3.0, True),
        ("mean", [1.0, 2.0], 1.5, True),
    ],
)
def test_the_readings_are_summed_up_and_held_to_the_bound(summary, readings, value, passed):
    check = _spec(summary).check(readings)
    assert check.value == value and check.passed is passed and check.note == "why"


def test_a_missing_or_broken_reading_makes_the_check_not_measured_by_its_policy():
    assert _spec("max").check([]).note == "not measured: nothing to read"
    assert _spec("max").check([2.0, math.nan]).passed is None  # "all": one broken run
    dropped = _spec("max", "dropped").check([2.0, math.nan, 0.5])
    assert dropped.value == 2.0 and dropped.passed is True
    assert _spec("max", "dropped").check([math.nan]).value is None
    kept = _spec("mean", "kept").check([2.0, math.nan])
    assert math.isnan(kept.value) and kept.passed is None
    assert "not measured" not in kept.note


def test_a_note_given_with_the_readings_replaces_the_declared_one():
    spec = CheckSpec("y", at_most(0.5), "max", "declared", "absent")
    assert spec.check([0.25], note="declared; and more").note == "declared; and more"
