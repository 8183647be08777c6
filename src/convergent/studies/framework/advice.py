"""The README's "What to use" table: one row per method, written from the verdicts.

A study's ``advice(payload)`` returns :class:`Advice` rows: the method, when to use it (or
not), at which setting, the keys of the claims that are its evidence, and what stays unknown.
The framework counts the evidence's verdicts (`evidence_counts`), so no verdict is retyped; a
row that names a key no claim has fails (`claim_of` raises).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.studies.framework.claims import VERDICTS
from convergent.studies.framework.common import table_cell
from convergent.studies.framework.summary import claim_of, listed

WORDS_PER_BRIEF = 110  # a study's README summary is about 100 words; this is the hard limit


@dataclass(frozen=True)
class Advice:
    """One row of the "What to use" table.

    Attributes:
        method: the method and the use it is judged for, e.g. "HORST, then one-shot pruning".
        when: when to use it, or what to use instead, following from the verdicts.
        setting: the setting that was tested, with each number's unit or name.
        evidence: the keys of the claims the row rests on.
        unknown: what the study leaves open.
    """

    method: str
    when: str
    setting: str
    evidence: tuple[str, ...]
    unknown: str


Advise = Callable[[Mapping[str, Any]], Sequence[Advice]]


def evidence_counts(payload: Mapping[str, Any], keys: Sequence[str]) -> str:
    """The verdicts of the claims of ``keys``, counted: ``"5 reproduced, 1 untested (of 6)"``
    (a KeyError names the keys when one is not a claim of ``payload``)."""
    counts = Counter(str(claim_of(payload, key)["verdict"]) for key in keys)
    shown = ", ".join(f"{counts[verdict]} {verdict}" for verdict in VERDICTS if counts[verdict])
    return f"{shown} (of {len(keys)})"


def advice_lines(rows: Sequence[tuple[Mapping[str, Any], Advice]]) -> list[str]:
    """The "What to use" table from ``(payload, advice)`` pairs (nothing for none)."""
    if not rows:
        return []
    lines = [
        "### What to use",
        "",
        "One row per method, from the verdicts below; the evidence counts the verdicts of the "
        "claims each row rests on, and each study's report has every number.",
        "",
        "| method (study) | use it when | setting tested (units as named) | evidence: claims by "
        "verdict (count) | what stays unknown |",
        "|---|---|---|---|---|",
    ]
    for payload, advice in rows:
        cells = [
            f"{advice.method} (`{payload['name']}`)",
            advice.when,
            advice.setting,
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
