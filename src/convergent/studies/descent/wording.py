"""The words the ``descent`` study's summary and brief share: a selected strength, whether the
constraints bound (the claims' manipulation checks, read back from a ``results.json`` claim),
percentages and points, and the test-set size behind the accuracies."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from convergent.studies.descent.checks import ACTIVE_CHECK, PEAK_CHECK, robustness_key

# Each perturbation kind (a key of ``data.text.levels``) in a user's words.
SHIFTS = {
    "gaussian": "Gaussian embedding noise",
    "uniform": "uniform embedding noise",
    "discrete": "random token swaps",
    "typos": "typos",
    "word_dropout": "word dropout",
}


MAX_TEST_SIZE = 100_000  # accuracies are read as exact shares of a test set at most this large


Claim = Mapping[str, Any]


def grouped(verdicts: Mapping[str, str], labels: Mapping[str, str]) -> dict[str, list[str]]:
    """The labels of ``labels`` (by claim key) gathered by their claim's verdict, in order."""
    by_verdict: dict[str, list[str]] = {}
    for key, label in labels.items():
        by_verdict.setdefault(verdicts[key], []).append(label)
    return by_verdict


def shift_labels(payload: Mapping[str, Any]) -> dict[str, str]:
    """Each perturbation kind's claim key and its words, in the data's order."""
    kinds = payload["data"]["text"]["levels"]
    return {robustness_key(kind): SHIFTS.get(kind, kind.replace("_", " ")) for kind in kinds}


def signed_points(value: float) -> str:
    """An accuracy difference (a fraction) in signed percentage points."""
    return f"{100 * value:+.1f}"


def percent(value: float) -> str:
    return f"{100 * value:.0f} %"


def short_of(value: float, floor: float, digits: int) -> str:
    """A value that missed ``floor``, with ``digits`` more significant digits (``.Ng``; for
    ``digits`` 0, whole numbers) until it no longer prints as the floor: 0.0996 against 0.1
    reads 0.0996, not 0.1."""
    for extra in range(digits, digits + 6):
        text = f"{value:.{extra}f}" if digits == 0 else f"{value:.{extra + 1}g}"
        if float(text) != floor:
            return text
    return f"{value:g}"


def required_floor(check: Mapping[str, Any]) -> float:
    """The number in a check's requirement (``">= 0.1"`` gives 0.1)."""
    return float(str(check["required"]).split()[-1])


def check_named(claim: Claim, start: str) -> Mapping[str, Any]:
    return next(check for check in claim["checks"] if check["name"].startswith(start))


def strength(point: Mapping[str, Any]) -> str:
    """A selected constrained point in a user's terms."""
    cost = point["resilient_cost"]
    slack = "hard, no slack" if cost is None else f"slack allowed at cost c = {cost:g}"
    return (
        f"alpha = {point['alpha']:g}, each layer to cut the loss by {percent(point['alpha'])}; "
        f"{slack}"
    )


def binding(claim: Claim) -> tuple[bool, str]:
    """Whether the constraints bound in every seed (the claim's manipulation checks), and the
    measured multiplier and active share in words."""
    peak, active = check_named(claim, PEAK_CHECK), check_named(claim, ACTIVE_CHECK)
    if peak["value"] is None or active["value"] is None:
        return False, "a seed recorded no multiplier"
    if peak["passed"] and active["passed"]:
        steps = (
            "every training step"
            if active["value"] >= 1
            else f"at least {percent(active['value'])} of training steps"
        )
        return True, (
            f"lambda reached at least {peak['value']:.2g} in every seed, and some lambda was "
            f"positive in {steps}"
        )
    low_peak = (
        f"the largest lambda was as low as {short_of(peak['value'], required_floor(peak), 1)}, where "
        f"the check needs {required_floor(peak):g}"
    )
    few_steps = (
        "some lambda was positive in as few as "
        f"{short_of(100 * active['value'], 100 * required_floor(active), 0)} % of training steps, "
        f"where the check needs {percent(required_floor(active))}"
    )
    if not peak["passed"] and not active["passed"]:
        return False, f"{low_peak}, and {few_steps}"
    if not peak["passed"]:  # name the passed check as passed, not as a reason
        return False, f"{low_peak}, though some lambda was positive in at least " + (
            f"{percent(active['value'])} of training steps"
        )
    return False, f"lambda reached at least {peak['value']:.2g} in every seed, but {few_steps}"


def what_ran(claim: Claim) -> str:
    """What unbound constrained runs were: ERM in all but name when both binding checks failed;
    when one passed, runs the declared check does not count as constrained."""
    peak, active = check_named(claim, PEAK_CHECK), check_named(claim, ACTIVE_CHECK)
    if peak["value"] is None or active["value"] is None:
        return "the declared check cannot count those runs as constrained training"
    if not peak["passed"] and not active["passed"]:
        return "those runs were ERM in all but name"
    return "the declared check does not count those runs as constrained training"


def test_sentences(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> int | None:
    """The test-set size behind the clean accuracies (each a share of the same test set, so
    their common denominator), or None when they are not exact shares of one."""
    accuracies = [float(record["clean"]) for records in runs.values() for record in records]
    shares = [Fraction(value).limit_denominator(MAX_TEST_SIZE) for value in accuracies]
    if not shares or any(abs(s - a) > 1e-12 for s, a in zip(shares, accuracies, strict=True)):
        return None
    size = math.lcm(*(share.denominator for share in shares))
    return size if 1 < size <= MAX_TEST_SIZE else None
