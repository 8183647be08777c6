"""A study's plain summary: a few sentences a user can act on, written from the verdicts.

A study's ``summary(payload)`` returns :class:`Sentence` objects: what was tested and at what
scale, what a user should conclude and do (which method, at which strength, when), and what
stays unknown. Each sentence declares the verdicts it states, by claim name (`claim_names`),
so that `misstated_verdicts` can check them against the results: a sentence cannot say
"reproduced" of a claim the results hold untested. A study builds its sentences by reading the
verdicts (`verdict_of`), so a rescored result rewrites its own summary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convergent.studies.framework.claims import VERDICTS
from convergent.studies.framework.common import claim_names

Summarize = Callable[[Mapping[str, Any]], Sequence["Sentence"]]


@dataclass(frozen=True)
class Sentence:
    """One plain sentence of a study's summary.

    Attributes:
        text: the sentence.
        verdicts: ``{claim name: verdict}`` for every claim whose verdict the sentence states
            (names as `claim_names` gives them; verdicts among `VERDICTS`).
    """

    text: str
    verdicts: Mapping[str, str] = field(default_factory=dict)


def claims_by_name(payload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The payload's claim records keyed by their names."""
    claims = payload["claims"]
    return dict(zip(claim_names(claims), claims, strict=True))


def verdict_of(payload: Mapping[str, Any], name: str) -> str:
    """The verdict the results hold for the claim named ``name``; a KeyError names the known
    claims when there is none (a study's summary must follow its claims' wording)."""
    claims = claims_by_name(payload)
    if name not in claims:
        raise KeyError(f"no claim named {name!r}; the claims are: {sorted(claims)}")
    return str(claims[name]["verdict"])


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
    claims = claims_by_name(payload)
    problems = []
    for sentence in sentences:
        for name, verdict in sentence.verdicts.items():
            held = claims[name]["verdict"] if name in claims else None
            if held != verdict:
                problems.append(f"{sentence.text!r} says {name!r} is {verdict}, results: {held}")
        undeclared = set(named_verdicts(sentence.text)) - set(sentence.verdicts.values())
        if undeclared:
            problems.append(f"{sentence.text!r} names {sorted(undeclared)} without declaring it")
    return problems


def summary_lines(sentences: Sequence[Sentence]) -> list[str]:
    """The sentences as one markdown paragraph (nothing for none)."""
    return [" ".join(sentence.text for sentence in sentences), ""] if sentences else []
