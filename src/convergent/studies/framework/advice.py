"""The README's "What to use" table: one row per method, written from the verdicts.

A study's ``advice(payload)`` returns :class:`Advice` rows: the method, when to use it (or
not), at which setting and scale, the keys of the claims that are its evidence, the keys of
those its recommendation rests on, the grid searches behind its setting, and what stays
unknown. The framework writes what the claims say (STUDIES.md rule 17): each claim the row
rests on with its effect, interval and unit and whether it survives Holm's adjustment over its
family; the evidence's verdicts counted, those that do not survive Holm apart; "selected on a
grid edge" where a selection was; and "a consistent direction, not established" in front of a
recommendation whose claims all fail Holm. No verdict is retyped; a row that names a key no
claim has fails (`claim_of` raises).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.studies.framework.claims import VERDICTS, holm_words
from convergent.studies.framework.common import table_cell
from convergent.studies.framework.numbers import format_interval, format_number
from convergent.studies.framework.summary import claim_of, listed

WORDS_PER_BRIEF = 110  # a study's README summary is about 100 words; this is the hard limit
NOT_ESTABLISHED = "a consistent direction, not established"


@dataclass(frozen=True)
class Advice:
    """One row of the "What to use" table.

    Attributes:
        method: the method and the use it is judged for, e.g. "HORST, then one-shot pruning".
        when: when to use it, or what to use instead, following from the verdicts.
        setting: the setting that was tested, with each number's unit or name.
        evidence: the keys of the claims the row's study part tested.
        unknown: what the study leaves open.
        scale: the model and data the claims were measured on ("a 2-layer character LM,
            d_model 128, on Austen").
        rests_on: the keys of the claims ``when`` rests on (none where it recommends
            nothing): each is shown with its effect and interval.
        selections: the ``tuning`` experiments whose selected points ``setting`` names.
    """

    method: str
    when: str
    setting: str
    evidence: tuple[str, ...]
    unknown: str
    scale: str = ""
    rests_on: tuple[str, ...] = ()
    selections: tuple[str, ...] = ()


Advise = Callable[[Mapping[str, Any]], Sequence[Advice]]


def _not_after_holm(record: Mapping[str, Any]) -> bool:
    return bool(holm_words(record.get("holm"), str(record["verdict"])))


def evidence_counts(payload: Mapping[str, Any], keys: Sequence[str]) -> str:
    """The verdicts of the claims of ``keys``, counted, those that do not survive Holm's
    adjustment over their family apart: ``"2 reproduced (1 not after Holm), 1 untested (of 3)"``
    (a KeyError names the keys when one is not a claim of ``payload``)."""
    records = [claim_of(payload, key) for key in keys]
    counts = Counter(str(record["verdict"]) for record in records)
    apart = Counter(str(record["verdict"]) for record in records if _not_after_holm(record))
    shown = ", ".join(
        f"{counts[verdict]} {verdict}"
        + (f" ({apart[verdict]} not after Holm)" if apart[verdict] else "")
        for verdict in VERDICTS
        if counts[verdict]
    )
    return f"{shown} (of {len(keys)})"


def established(record: Mapping[str, Any]) -> bool:
    """Whether a claim record's verdict decided (reproduced or not reproduced) and survives
    Holm's adjustment over its family (a claim outside any family, alone, does)."""
    return record["verdict"] in ("reproduced", "not reproduced") and not _not_after_holm(record)


def effect_text(record: Mapping[str, Any], unit: bool = True) -> str:
    """``"`key`: 0.0258 [0.00079, 0.0507] (unit), reproduced, not after Holm over 7 claims"``
    (without the unit where ``unit`` is false)."""
    interval = record.get("interval")
    shown = format_interval(None if interval is None else (interval[0], interval[1]))
    holm = record.get("holm") or {}
    family = ""
    if holm and ((holm["size"] > 1 and established(record)) or _not_after_holm(record)):
        family = (
            f", {'not ' if _not_after_holm(record) else ''}after Holm over {holm['size']} claims"
        )
    measured = f" ({record['unit']})" if unit else ""
    return (
        f"`{record['key']}`: {format_number(record.get('effect'))} {shown}{measured}, "
        f"{record['verdict']}{family}"
    )


def rests_on_text(payload: Mapping[str, Any], keys: Sequence[str]) -> str:
    """Each claim of ``keys`` by :func:`effect_text`; a unit the claims share is said once."""
    records = [claim_of(payload, key) for key in keys]
    if not records:
        return "no claim: nothing is recommended on this evidence"
    units = {str(record["unit"]) for record in records}
    if len(records) > 1 and len(units) == 1:
        shown = "; ".join(effect_text(record, unit=False) for record in records)
        return f"{shown} (each in {units.pop()})"
    return "; ".join(effect_text(record) for record in records)


def edge_text(payload: Mapping[str, Any], experiments: Sequence[str]) -> str:
    """``"selected on a grid edge: AdamW (lr), HORST (strength)"`` for the methods of the
    ``tuning`` ``experiments`` whose selection sat on an edge (empty where none did)."""
    tuning = payload.get("tuning", {})
    edges = [
        f"{method} ({', '.join(record['on_edge'])})"
        for experiment in experiments
        for method, record in tuning.get(experiment, {}).items()
        if record["on_edge"]
    ]
    return f"selected on a grid edge: {listed(edges)}" if edges else ""


def when_text(payload: Mapping[str, Any], advice: Advice) -> str:
    """``advice.when``, behind "a consistent direction, not established" where every claim
    the recommendation rests on fails its family's Holm adjustment."""
    records = [claim_of(payload, key) for key in advice.rests_on]
    if records and not any(established(record) for record in records):
        return f"{NOT_ESTABLISHED}: {advice.when}"
    return advice.when


def advice_lines(rows: Sequence[tuple[Mapping[str, Any], Advice]]) -> list[str]:
    """The "What to use" table from ``(payload, advice)`` pairs (nothing for none)."""
    if not rows:
        return []
    lines = [
        "### What to use",
        "",
        "One row per method, from the verdicts below. A row shows each claim its advice rests "
        "on, with the effect, its 95 % interval and unit, and whether it survives Holm's "
        "adjustment over the claims its study part tested together; the last columns count "
        "every claim of the part and say what stays open. Each study's report has every number.",
        "",
        "| method (study) | use it when | setting tested (units as named); scale | rests on: "
        "effect [95 % interval] (unit) | all its claims by verdict | what stays unknown |",
        "|---|---|---|---|---|---|",
    ]
    for payload, advice in rows:
        setting = "; ".join(
            part
            for part in (
                advice.setting,
                f"on {advice.scale}" if advice.scale else "",
                edge_text(payload, advice.selections),
            )
            if part
        )
        cells = [
            f"{advice.method} (`{payload['name']}`)",
            when_text(payload, advice),
            setting,
            rests_on_text(payload, advice.rests_on),
            evidence_counts(payload, advice.evidence),
            advice.unknown,
        ]
        lines.append("| " + " | ".join(table_cell(cell) for cell in cells) + " |")
    return [*lines, ""]


def word_count(text: str) -> int:
    """The words of ``text`` (runs of characters between spaces)."""
    return len(text.split())


def verdict_words(verdicts: Sequence[str]) -> str:
    """The verdicts of a group of claims in a few words: ``"reproduced"`` when they agree, else
    each verdict with its count, ``"4 reproduced and 2 untested"``."""
    counts = Counter(verdicts)
    if len(counts) == 1:
        return next(iter(counts))
    parts = [f"{counts[verdict]} {verdict}" for verdict in VERDICTS if counts[verdict]]
    return listed(parts)
