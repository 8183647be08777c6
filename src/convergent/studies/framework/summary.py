"""A study's plain summary: a few sentences a user can act on, written from the verdicts.

A study's ``summary(payload)`` returns :class:`Sentence` objects: what was tested and at what
scale, what a user should conclude and do (which method, at which strength, when), and what
stays unknown. Each sentence declares the verdicts it states, by claim key, so that
`misstated_verdicts` can check them against the results: a sentence cannot say "reproduced" of
a claim the results hold untested, nor name a claim the results do not hold. A study builds its
sentences by reading the verdicts (`verdict_of`), so a rescored result rewrites its own
summary; it finds a claim by its key, never by its wording.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convergent.studies.framework.claims import VERDICTS

Summarize = Callable[[Mapping[str, Any]], Sequence["Sentence"]]


@dataclass(frozen=True)
class Sentence:
    """One plain sentence of a study's summary.

    Attributes:
        text: the sentence.
        verdicts: ``{claim key: verdict}`` for every claim whose verdict the sentence states
            (verdicts among `VERDICTS`).
    """

    text: str
    verdicts: Mapping[str, str] = field(default_factory=dict)


def claims_by_key(payload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The payload's claim records by their keys, in the payload's order."""
    return {str(claim["key"]): claim for claim in payload["claims"]}


def claim_of(payload: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The claim record of ``key``; a KeyError names the known keys when the results hold no
    such claim (a summary that refers to a key no claim has fails here)."""
    claims = claims_by_key(payload)
    if key not in claims:
        raise KeyError(f"no claim has the key {key!r}; the keys are: {sorted(claims)}")
    return claims[key]


def verdict_of(payload: Mapping[str, Any], key: str) -> str:
    """The verdict the results hold for the claim of ``key`` (a KeyError as `claim_of`)."""
    return str(claim_of(payload, key)["verdict"])


def verdicts_of(payload: Mapping[str, Any], keys: Iterable[str]) -> dict[str, str]:
    """The verdicts of those claims of ``keys`` the results hold, by key, in ``keys``' order."""
    held = claims_by_key(payload)
    return {key: str(held[key]["verdict"]) for key in keys if key in held}


def named_verdicts(text: str) -> list[str]:
    """The verdict words in ``text`` ("not reproduced" is not also read as "reproduced")."""
    named = []
    for verdict in sorted(VERDICTS, key=len, reverse=True):
        if verdict in text:
            named.append(verdict)
            text = text.replace(verdict, " ")
    return named


def misstated_verdicts(sentences: Sequence[Sentence], payload: Mapping[str, Any]) -> list[str]:
    """Each verdict a sentence states that the results do not hold (empty when all agree),
    and each verdict a sentence's text names without declaring it."""
    claims = claims_by_key(payload)
    problems = []
    for sentence in sentences:
        for key, verdict in sentence.verdicts.items():
            if key not in claims:
                problems.append(f"{sentence.text!r} declares {key!r}, which no claim has")
                continue
            held = claims[key]["verdict"]
            if held != verdict:
                problems.append(f"{sentence.text!r} says {key!r} is {verdict}, results: {held}")
        undeclared = set(named_verdicts(sentence.text)) - set(sentence.verdicts.values())
        if undeclared:
            problems.append(f"{sentence.text!r} names {sorted(undeclared)} without declaring it")
    return problems


def summary_lines(sentences: Sequence[Sentence]) -> list[str]:
    """The sentences as one markdown paragraph (nothing for none)."""
    return [" ".join(sentence.text for sentence in sentences), ""] if sentences else []


def listed(items: Sequence[str]) -> str:
    """Items as a sentence lists them: ``a``, ``a and b``, ``a, b and c`` (empty: ``""``)."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)
