"""Claims with verdicts a user can act on: an effect, its interval, and proof the method acted.

A paper's claim is tested as a threshold on one measured quantity, the *effect*, computed once
per seed (for a comparison, per seed *pair*: method and baseline trained from the same seed).
The 95 % interval is a Student-t interval over those per-seed values (for paired runs, over
the paired differences), so it covers the seed-to-seed variance of the whole pipeline:
initialization, data order and noise draws. Every claim also names one or more
*manipulation checks*: measured quantities that show the method was actually exercised
(HORST's mirror step moved the weights, a constraint bound, the Langevin noise mattered).

Verdicts, in this order of precedence:

- ``untested``: a manipulation check failed or was not measured; the effect is still shown.
- ``reproduced``: the interval lies inside the region where the claim holds.
- ``not reproduced``: the interval lies wholly outside it.
- ``inconclusive``: the interval straddles the region's edge.

With one seed there is no interval and the point estimate decides. With fewer than
``PREVIEW_BELOW`` (3) seeds the verdict is a *preview*.

``results.json`` schema (the stable part): the top-level ``claims`` list holds one object per
claim with

- ``key`` (str): the claim's stable name, ``study.snake_case`` (e.g.
  ``sparsity.horst_survives_sparsegpt_70``); summaries, reports and the history tables find a
  claim by it, never by its wording, which may be reworded.
- ``statement`` (str): the claim in the paper's terms.
- ``verdict`` (str): one of ``reproduced``, ``not reproduced``, ``inconclusive``, ``untested``.
- ``preview`` (bool): true when ``n`` < 3.
- ``effect`` (float or null): the mean of the per-seed effects (null when none is finite).
- ``unit`` (str): what the effect measures, with its unit.
- ``threshold`` (object): ``{"form": ">=" | "<=" | "within", "value": float | [low, high],
  "text": str}``; the claim holds where ``effect form value``.
- ``interval`` ([low, high] or null): the 95 % interval of the effect (null below 2 seeds).
- ``interval_method`` (str): how the interval was computed.
- ``degrees_of_freedom`` (float or null): the Student-t's behind ``interval`` (``n - 1`` for
  an interval over per-seed values; Satterthwaite's for a two-way one).
- ``holm`` (object, only for a tested claim): ``{"family", "size", "p_value", "adjusted",
  "holds"}``, the claim's test within its study part's family (:mod:`.family`); a verdict
  whose adjusted test fails reads "reproduced (not after Holm over N claims)".
- ``n`` (int): the number of seeds (or seed pairs) behind the effect.
- ``per_seed`` (list of float): the per-seed effects.
- ``checks`` (list): ``{"name", "value", "required", "passed"}`` per manipulation check;
  ``value`` and ``passed`` are null when the quantity was not measured.
- ``evidence`` (str): the numbers behind the effect in a sentence or two.
- ``exploratory`` (bool, only when true): the claim's current form scored on data an earlier
  design collected, after its numbers were seen; a confirmation on new seeds decides.
- ``revised`` (str, only when set): what changed in this claim's test since the previous
  design, and why.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from scipy import stats

from convergent.studies.framework.numbers import finite_or_none, format_interval, format_number

VERDICTS = ("reproduced", "not reproduced", "inconclusive", "untested")
PREVIEW_BELOW = 3
CONFIDENCE = 0.95
T_INTERVAL = "95 % Student-t interval over the per-seed values"
PAIRED_T_INTERVAL = "95 % Student-t interval over the paired per-seed differences"

Form = Literal[">=", "<=", "within"]
# A claim's key: the study's name, a dot, then snake case (dots may group further).
KEY = re.compile(r"[a-z][a-z0-9]*(\.[a-z0-9]+(_[a-z0-9]+)*)+")


def check_key(key: str) -> str:
    """Return ``key`` if it is a claim key (``study.snake_case``), else raise a ValueError."""
    if not isinstance(key, str) or KEY.fullmatch(key) is None:
        raise ValueError(
            f"a claim key is the study's name, a dot and snake case (e.g. "
            f"'sparsity.horst_survives_sparsegpt_70'), got {key!r}"
        )
    return key


@dataclass(frozen=True)
class Threshold:
    """Where a claim holds: ``effect >= value``, ``effect <= value`` or ``low <= effect <= high``.

    Attributes:
        form: ``">="``, ``"<="`` or ``"within"``.
        value: the bound, or ``(low, high)`` for ``"within"``.
    """

    form: Form
    value: float | tuple[float, float]

    def __post_init__(self) -> None:
        if self.form not in (">=", "<=", "within"):
            raise ValueError(f"threshold form must be '>=', '<=' or 'within', got {self.form!r}")
        if self.form == "within":
            if not isinstance(self.value, tuple) or len(self.value) != 2:
                raise ValueError(f"a 'within' threshold needs (low, high), got {self.value!r}")
            if self.value[0] > self.value[1]:
                raise ValueError(f"a 'within' threshold needs low <= high, got {self.value!r}")
        elif isinstance(self.value, tuple):
            raise ValueError(f"a {self.form!r} threshold needs one number, got {self.value!r}")

    @property
    def bounds(self) -> tuple[float, float]:
        """The region where the claim holds, as ``(low, high)`` (infinite where open)."""
        if self.form == "within":
            assert isinstance(self.value, tuple)
            return float(self.value[0]), float(self.value[1])
        assert not isinstance(self.value, tuple)
        if self.form == ">=":
            return float(self.value), math.inf
        return -math.inf, float(self.value)

    @property
    def text(self) -> str:
        """``">= 0.01"``, ``"<= 0"`` or ``"within [-0.05, 0.05]"``."""
        if self.form == "within":
            low, high = self.bounds
            return f"within [{low:g}, {high:g}]"
        return f"{self.form} {self.value:g}"

    def to_json(self) -> dict[str, Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"form": self.form, "value": value, "text": self.text}


def at_least(value: float) -> Threshold:
    """The claim holds where the effect is ``>= value``."""
    return Threshold(">=", float(value))


def at_most(value: float) -> Threshold:
    """The claim holds where the effect is ``<= value``."""
    return Threshold("<=", float(value))


def within(low: float, high: float) -> Threshold:
    """The claim holds where ``low <= effect <= high`` (an equivalence margin)."""
    return Threshold("within", (float(low), float(high)))


@dataclass(frozen=True)
class Check:
    """A manipulation check: a measured quantity that shows the method was exercised.

    Attributes:
        name: what was measured, e.g. ``"mirror move / Adam move (HORST, mean over steps)"``.
        value: the measurement, or None when this run did not measure or store it.
        required: where it must lie for the method to count as exercised.
        note: why the requirement is what it is, or why the value is missing.
    """

    name: str
    value: float | None
    required: Threshold
    note: str = ""

    @property
    def passed(self) -> bool | None:
        """True or False; None when the value was not measured."""
        if self.value is None or not math.isfinite(self.value):
            return None
        low, high = self.required.bounds
        return low <= self.value <= high

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": finite_or_none(self.value),
            "required": self.required.text,
            "passed": self.passed,
            "note": self.note,
        }


def t_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The Student-t interval of the mean of ``values``; None with fewer than 2 finite values.

    Args:
        values: one number per seed (for paired runs, the per-seed differences); values
            that are not finite (a diverged run) are left out.
        confidence: the coverage, 0.95 by default.

    Returns:
        ``(low, high)``, or None when it cannot be computed.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    finite = [float(v) for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return None
    count = len(finite)
    mean = math.fsum(finite) / count
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (count - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, count - 1)) * spread / math.sqrt(count)
    return mean - half, mean + half


def decide(
    effect: float | None,
    interval: tuple[float, float] | None,
    threshold: Threshold,
    checks: Sequence[Check],
) -> str:
    """The verdict from the effect, its interval, the claim's region and the checks.

    A failed or unmeasured check gives ``untested``. Otherwise the interval (or, without
    one, the point estimate) inside the region gives ``reproduced``, wholly outside
    ``not reproduced``, and across an edge ``inconclusive``. A missing effect gives
    ``inconclusive``.
    """
    if any(check.passed is not True for check in checks):
        return "untested"
    if effect is None or not math.isfinite(effect):
        return "inconclusive"
    low_end, high_end = interval if interval is not None else (effect, effect)
    low, high = threshold.bounds
    if low <= low_end and high_end <= high:
        return "reproduced"
    if high_end < low or low_end > high:
        return "not reproduced"
    return "inconclusive"


ALPHA = (1 - CONFIDENCE) / 2  # the one-sided level of each bound a 95 % interval tests


@dataclass(frozen=True)
class FamilyTest:
    """A claim's test within its family.

    Attributes:
        family: the family's name (the study part).
        size: how many tested claims the family holds.
        p_value: the claim's decisive p-value (see the module docstring).
        adjusted: Holm's adjusted p-value over the family.
    """

    family: str
    size: int
    p_value: float
    adjusted: float

    @property
    def holds(self) -> bool:
        """Whether the claim's decision survives Holm's adjustment at ``ALPHA``."""
        return self.adjusted <= ALPHA

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "size": self.size,
            "p_value": self.p_value,
            "adjusted": self.adjusted,
            "holds": self.holds,
        }


@dataclass(frozen=True)
class Claim:
    """A paper's claim, the effect that tests it, and the verdict.

    Build one with :func:`claim_from_seeds` (it computes the effect and the interval).

    Attributes:
        key: the claim's stable name (``study.snake_case``), by which summaries, reports and
            history find it; a reworded statement keeps its key.
        statement: the claim in the paper's terms, and its form here.
        unit: what the effect measures, with its unit (e.g. ``"accuracy points"``).
        threshold: where the claim holds.
        per_seed: the effect in each seed (paired difference where runs share a seed).
        effect: the mean of ``per_seed`` (None when none is finite).
        interval: the 95 % interval of the effect, or None below 2 seeds.
        interval_method: how ``interval`` was computed.
        checks: the manipulation checks.
        evidence: the numbers behind the effect, in a sentence or two.
        exploratory: scored in its current form on data an earlier design collected (after
            that data was seen): a hypothesis for new seeds to confirm, not a result.
        revised: what changed in this claim's test since the previous design, and why.
        degrees_of_freedom: the Student-t's behind ``interval`` (None: ``n - 1``, an interval
            over the per-seed values).
        family: the claim's test within its study part's family (Holm), set by
            :func:`~convergent.studies.framework.family.family_tested`.
    """

    key: str
    statement: str
    unit: str
    threshold: Threshold
    per_seed: tuple[float, ...]
    effect: float | None
    interval: tuple[float, float] | None
    interval_method: str
    checks: tuple[Check, ...] = ()
    evidence: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    exploratory: bool = False
    revised: str = ""
    degrees_of_freedom: float | None = None
    family: FamilyTest | None = None

    def __post_init__(self) -> None:
        check_key(self.key)

    @property
    def n(self) -> int:
        """The seeds behind the effect (a diverged seed's NaN does not count)."""
        return sum(math.isfinite(v) for v in self.per_seed)

    @property
    def freedom(self) -> float | None:
        """The degrees of freedom behind ``interval`` (None without one)."""
        if self.interval is None:
            return None
        return self.degrees_of_freedom if self.degrees_of_freedom is not None else self.n - 1

    @property
    def preview(self) -> bool:
        """True below 3 seeds: the verdict is a preview, not a result."""
        return self.n < PREVIEW_BELOW

    @property
    def verdict(self) -> str:
        return decide(self.effect, self.interval, self.threshold, self.checks)

    @property
    def label(self) -> str:
        """The verdict as printed: ``reproduced``, ``reproduced (preview)`` below 3 seeds,
        ``reproduced (exploratory)`` on an earlier design's data, ``reproduced (not after Holm
        over 7 claims)`` where its family's adjustment does not keep it."""
        holm = self.family.to_json() if self.family is not None else None
        return self.verdict + qualifiers(self.preview, self.exploratory, holm, self.verdict)

    def summary(self) -> str:
        """One line: effect, interval, n, threshold and the checks."""
        return (
            f"effect {format_number(self.effect)} {self.unit} "
            f"(95 % interval {format_interval(self.interval)}, n={self.n}; "
            f"holds if {self.threshold.text}); checks: {format_checks(self.checks)}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "statement": self.statement,
            "verdict": self.verdict,
            "preview": self.preview,
            "effect": finite_or_none(self.effect),
            "unit": self.unit,
            "threshold": self.threshold.to_json(),
            "interval": None if self.interval is None else [*map(float, self.interval)],
            "interval_method": self.interval_method,
            "degrees_of_freedom": finite_or_none(self.freedom),
            "n": self.n,
            "per_seed": [finite_or_none(v) for v in self.per_seed],
            "checks": [check.to_json() for check in self.checks],
            "evidence": self.evidence,
            **({"holm": self.family.to_json()} if self.family is not None else {}),
            **({"extra": self.extra} if self.extra else {}),
            **({"exploratory": True} if self.exploratory else {}),
            **({"revised": self.revised} if self.revised else {}),
        }


def claim_from_seeds(
    statement: str,
    per_seed: Sequence[float],
    threshold: Threshold,
    *,
    key: str,
    unit: str,
    checks: Sequence[Check] = (),
    evidence: str = "",
    paired: bool = False,
    extra: dict[str, Any] | None = None,
    revised: str = "",
) -> Claim:
    """A claim whose effect is the mean of one number per seed, with its t-interval.

    Args:
        statement: the claim in the paper's terms.
        per_seed: the effect in each seed; for a comparison, the paired difference
            (method minus baseline, or the claim's own contrast) of runs sharing a seed.
        threshold: where the claim holds.
        key: the claim's stable name, ``study.snake_case``.
        unit: what the effect measures.
        checks: the manipulation checks.
        evidence: the numbers behind the effect.
        paired: say in the report that the values are paired differences.
        extra: more numbers worth keeping with the claim (JSON-ready).
        revised: what changed in this claim's test since the previous design, and why.
    """
    values = tuple(float(v) for v in per_seed)
    finite = [v for v in values if math.isfinite(v)]
    effect = math.fsum(finite) / len(finite) if finite else None
    return Claim(
        key=key,
        statement=statement,
        unit=unit,
        threshold=threshold,
        per_seed=values,
        effect=effect,
        interval=t_interval(values),
        interval_method=PAIRED_T_INTERVAL if paired else T_INTERVAL,
        checks=tuple(checks),
        evidence=evidence,
        extra=dict(extra or {}),
        revised=revised,
    )


def holm_words(holm: Mapping[str, Any] | None, verdict: str) -> str:
    """``"not after Holm over 7 claims"`` where a verdict that decided (reproduced or not
    reproduced) does not survive its family's Holm adjustment (a claim record's ``holm``);
    empty otherwise."""
    if not holm or verdict not in ("reproduced", "not reproduced") or holm["holds"]:
        return ""
    return f"not after Holm over {holm['size']} claims"


def qualifiers(
    preview: bool, exploratory: bool, holm: Mapping[str, Any] | None = None, verdict: str = ""
) -> str:
    """What follows a verdict word: ``" (preview)"``, ``" (exploratory)"``, ``" (not after
    Holm over N claims)"``, several or nothing."""
    words = [word for word, on in (("preview", preview), ("exploratory", exploratory)) if on]
    words += [word for word in [holm_words(holm, verdict)] if word]
    return f" ({', '.join(words)})" if words else ""


def as_exploratory(claims: Sequence[Claim]) -> list[Claim]:
    """``claims`` marked exploratory: scored in their current form on an earlier design's data."""
    return [dataclasses.replace(claim, exploratory=True) for claim in claims]


def not_measured(name: str, required: Threshold, why: str) -> Check:
    """A check whose quantity this run did not measure or store: the verdict is ``untested``."""
    return Check(name, None, required, note=f"not measured: {why}")


def format_checks(checks: Sequence[Check]) -> str:
    if not checks:
        return "none"
    parts = []
    for check in checks:
        state = {True: "ok", False: "FAILED", None: "NOT MEASURED"}[check.passed]
        parts.append(
            f"{check.name} = {format_number(check.value)} (need {check.required.text}) {state}"
        )
    return "; ".join(parts)
