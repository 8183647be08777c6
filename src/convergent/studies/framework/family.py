"""The claims a study part tests together are one family: Holm's adjustment over it.

Each claim is decided by its 95 % two-sided interval against the region where it holds: a
bound outside the interval is a one-sided test at level ``ALPHA`` = 2.5 %, and an equivalence
("within") claim is two such tests (TOST). So every tested claim carries one *decisive*
p-value, read off the same Student-t that gave its interval (the effect, the interval's
half-width and its degrees of freedom):

- ``reproduced``: the p-value of "the effect lies outside the region" (for ``within``, the
  larger of the two one-sided p-values);
- ``not reproduced``: the p-value of "the effect lies inside the region";
- ``inconclusive``: the smaller of the two (above ``ALPHA`` by construction).

Over the ``m`` tested claims of a family (``untested`` ones are not tests), Holm's step-down
adjustment sorts the p-values, p_(1) <= ... <= p_(m), and sets adjusted p_(i) =
max over j <= i of min(1, (m - j + 1) p_(j)). A verdict of ``reproduced`` or ``not
reproduced`` whose adjusted p-value exceeds ``ALPHA`` stands "not after Holm over m claims":
each test alone passed, but the family's chance of one false finding is not held at
``ALPHA``. The verdict itself is kept (it is the claim's own test); reports print the
qualifier beside it and the README counts such claims apart.

A study names its families by key prefix (``{"sparsity.finetune_": "(c) fine-tune, then
prune"}``); the longest matching prefix wins, and a key no prefix matches is in the study's
own family.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from scipy import stats

from convergent.studies.framework.claims import ALPHA, Claim, FamilyTest

DECIDED = ("reproduced", "not reproduced")


def family_of(key: str, families: Mapping[str, str]) -> str:
    """The family of claim ``key``: the name of the longest prefix of ``families`` it starts
    with, else the study's name (the key before its first dot)."""
    matches = [prefix for prefix in families if key.startswith(prefix)]
    return families[max(matches, key=len)] if matches else key.split(".", 1)[0]


def _tail_above(distance: float, scale: float, freedom: float) -> float:
    """P(T >= distance / scale) for Student's t with ``freedom`` degrees of freedom; an
    infinite ``distance`` (an open bound) or a zero ``scale`` (a degenerate interval) gives 0
    or 1 by the sign of ``distance``."""
    if math.isinf(distance) or scale <= 0:
        return 0.0 if distance > 0 else 1.0
    return float(stats.t.sf(distance / scale, freedom))


def decisive_p_value(
    verdict: str,
    effect: float | None,
    interval: Sequence[float] | None,
    degrees_of_freedom: float,
    bounds: tuple[float, float],
) -> float:
    """The p-value that decided ``verdict`` (NaN where there is no test: untested, no
    interval or no effect).

    Args:
        verdict: the claim's verdict.
        effect: its estimate.
        interval: its symmetric 95 % interval ``(low, high)``.
        degrees_of_freedom: the t distribution's behind the interval.
        bounds: the region where the claim holds, ``(low, high)``, infinite where open.
    """
    if verdict not in (*DECIDED, "inconclusive") or interval is None or effect is None:
        return math.nan
    if not (math.isfinite(effect) and degrees_of_freedom > 0):
        return math.nan
    half = (float(interval[1]) - float(interval[0])) / 2
    scale = half / float(stats.t.ppf(1 - ALPHA, degrees_of_freedom))
    low, high = bounds
    # Each one-sided p-value: P(T >= distance / scale), the distance from a bound toward the
    # side the test reads (an open bound is met at once, or never).
    above_low = _tail_above(effect - low, scale, degrees_of_freedom)  # H0: effect <= low
    below_high = _tail_above(high - effect, scale, degrees_of_freedom)  # H0: effect >= high
    below_low = _tail_above(low - effect, scale, degrees_of_freedom)  # H0: effect >= low
    above_high = _tail_above(effect - high, scale, degrees_of_freedom)  # H0: effect <= high
    holds, fails = max(above_low, below_high), min(below_low, above_high)
    if verdict == "reproduced":
        return holds
    if verdict == "not reproduced":
        return fails
    return min(holds, fails)


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given."""
    order = sorted(range(len(p_values)), key=lambda index: p_values[index])
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def _tests(
    rows: Sequence[tuple[str, float]], families: Mapping[str, str]
) -> list[FamilyTest | None]:
    """A :class:`FamilyTest` per ``(key, decisive p-value)`` row (None where the p-value is
    NaN: not a test)."""
    grouped: dict[str, list[int]] = {}
    for index, (key, p_value) in enumerate(rows):
        if math.isfinite(p_value):
            grouped.setdefault(family_of(key, families), []).append(index)
    found: list[FamilyTest | None] = [None] * len(rows)
    for name, members in grouped.items():
        adjusted = holm_adjusted([rows[i][1] for i in members])
        for index, value in zip(members, adjusted, strict=True):
            found[index] = FamilyTest(name, len(members), rows[index][1], value)
    return found


def claim_p_value(claim: Claim) -> float:
    """A claim's decisive p-value (that of its stored record)."""
    return record_p_value(claim.to_json())


def family_tested(claims: Sequence[Claim], families: Mapping[str, str]) -> list[Claim]:
    """``claims`` with their :class:`FamilyTest` over the study parts of ``families``."""
    tests = _tests([(claim.key, claim_p_value(claim)) for claim in claims], families)
    return [
        dataclasses.replace(claim, family=test) for claim, test in zip(claims, tests, strict=True)
    ]


def record_p_value(record: Mapping[str, Any]) -> float:
    """A stored claim record's decisive p-value (its degrees of freedom as stored, else those
    of its resolution, else its seeds' n - 1)."""
    freedom = record.get("degrees_of_freedom")
    if freedom is None:
        freedom = (record.get("extra") or {}).get("resolution", {}).get("degrees_of_freedom")
    if freedom is None:
        freedom = record["n"] - 1
    threshold = record["threshold"]
    value = threshold["value"]
    bounds = {
        ">=": lambda: (float(value), math.inf),
        "<=": lambda: (-math.inf, float(value)),
        "within": lambda: (float(value[0]), float(value[1])),
    }[threshold["form"]]()
    return decisive_p_value(
        record["verdict"], record.get("effect"), record.get("interval"), float(freedom), bounds
    )


def family_tested_records(
    records: Sequence[Mapping[str, Any]], families: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Stored claim records (an earlier design's, scored then) with the family test their
    claims would carry now, under ``"holm"``."""
    tests = _tests([(str(r["key"]), record_p_value(r)) for r in records], families)
    return [
        {**record, **({"holm": test.to_json()} if test is not None else {})}
        for record, test in zip(records, tests, strict=True)
    ]


def family_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's paragraph on the families of ``records`` (claim records with ``holm``):
    each family's tested claims, and which decided verdicts its Holm adjustment does not keep
    (nothing where no claim was tested)."""
    families: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("holm"):
            families.setdefault(record["holm"]["family"], []).append(record)
    if not families:
        return []
    parts = []
    for name, members in families.items():
        dropped = [
            f"`{r['key']}`" for r in members if r["verdict"] in DECIDED and not r["holm"]["holds"]
        ]
        kept = f"; not kept by Holm: {', '.join(dropped)}" if dropped else ""
        parts.append(f"{name}: {len(members)} tested claim(s){kept}")
    return [
        "Each study part's tested claims are one family. Beside its own test, each verdict "
        "that decided (reproduced or not reproduced) is checked by Holm's step-down adjustment "
        f"over its family at the one-sided level each bound of a 95 % interval tests "
        f'({100 * ALPHA:g} %); one that does not survive it reads "not after Holm over N '
        'claims" and supports no recommendation on its own. Two-way intervals keep every '
        "variance term (a component estimated below zero is not cut to zero). Families: "
        + "; ".join(parts)
        + ".",
        "",
    ]
