"""What the ``descent`` study tells a user in a minute: the README summary (whether to
constrain for robustness, the clean cost, what stays open) and its "What to use" row, from the
verdicts by key; the report keeps the long findings (`summary`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from convergent.studies.descent.checks import (
    ACTIVE_CHECK,
    BUMP_CHECK,
    CLEAN_KEY,
    CLEAN_PAPER_KEY,
    LANGUAGE_CLEAN_KEY,
    LANGUAGE_MONOTONE_KEY,
    LANGUAGE_NOISE_KEY,
    PEAK_CHECK,
    TEXT_MONOTONE_KEY,
    TEXT_TUNING,
    VIDEO_MONOTONE_KEY,
    VIDEO_NOISE_KEY,
)
from convergent.studies.descent.wording import shift_labels, strength
from convergent.studies.framework import (
    Advice,
    Sentence,
    claims_by_key,
    listed,
    verdict_of,
    verdict_words,
    verdicts_of,
)

# The claims a user reads together, by what they are about (those the results hold are used).
GROUPS = {
    "the street-video denoiser": (VIDEO_NOISE_KEY, VIDEO_MONOTONE_KEY),
    "the language model": (LANGUAGE_CLEAN_KEY, LANGUAGE_NOISE_KEY, LANGUAGE_MONOTONE_KEY),
    "the text model's per-layer losses": (TEXT_MONOTONE_KEY,),
}
# Why a check left a claim untested, by how the check's name starts.
REASONS = {
    PEAK_CHECK: "the constraints barely bound",
    ACTIVE_CHECK: "the constraints barely bound",
    BUMP_CHECK: "ERM's own per-layer losses already fell layer by layer",
}


def _helped(payload: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The robustness claims' verdicts by key, and the shifts under which they reproduced."""
    labels = shift_labels(payload)
    verdicts = verdicts_of(payload, labels)
    return verdicts, [label for key, label in labels.items() if verdicts[key] == "reproduced"]


def _robustness(payload: Mapping[str, Any]) -> Sentence:
    verdicts, helped = _helped(payload)
    words = verdict_words(list(verdicts.values()))
    held = set(verdicts.values())
    if helped:
        text = (
            f"Where you expect {listed(helped)} at test time, try descent constraints on a text "
            f"classifier ({words})."
        )
    elif held == {"untested"}:
        text = f"Whether descent constraints make a text classifier robust is untested ({words})."
    else:
        text = (
            "For a text classifier, plain training (ERM) is the simpler choice: descent "
            f"constraints bought no robustness under shifted inputs ({words})."
        )
    return Sentence(text, verdicts)


CLEAN_TEXT = {
    "reproduced": "They cost no clean accuracy beyond the margins tested",
    "not reproduced": "They cost clean accuracy",
    "inconclusive": "Whether they cost clean accuracy is not resolved at this test size",
    "untested": "Their clean-accuracy cost is untested",
}


def _clean(payload: Mapping[str, Any]) -> Sentence:
    verdicts = verdicts_of(payload, (CLEAN_PAPER_KEY, CLEAN_KEY))
    held = sorted(set(verdicts.values()))
    lead = CLEAN_TEXT[held[0]] if len(held) == 1 else "Their clean-accuracy cost came out mixed"
    return Sentence(f"{lead} ({verdict_words(list(verdicts.values()))}).", verdicts)


def _reasons(payload: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """Why the untested claims of ``keys`` are untested, in plain words."""
    reasons = []
    for key in keys:
        for check in claims_by_key(payload)[key]["checks"]:
            if check["passed"] is not True:
                starts = [w for s, w in REASONS.items() if str(check["name"]).startswith(s)]
                reasons.append(starts[0] if starts else "a manipulation check failed")
    return list(dict.fromkeys(reasons))


def _open(payload: Mapping[str, Any]) -> list[Sentence]:
    """Per group of the other claims: what stays unknown, or what was found."""
    untested, verdicts, found = [], {}, []
    for group, keys in GROUPS.items():
        mine = verdicts_of(payload, keys)
        if not mine:
            continue
        if set(mine.values()) == {"untested"}:
            untested.append(group)
            verdicts.update(mine)
        else:
            words = verdict_words(list(mine.values()))
            found.append(Sentence(f"The claims on {group}: {words}.", mine))
    if not untested:
        return found
    why = listed(_reasons(payload, list(verdicts)))
    return [
        Sentence(
            f"Still unknown: the claims on {listed(untested)}, untested because {why}.", verdicts
        ),
        *found,
    ]


def brief(payload: Mapping[str, Any]) -> list[Sentence]:
    """The README summary: whether to use the constraints for robustness, their clean cost,
    and what stays unknown."""
    return [_robustness(payload), _clean(payload), *_open(payload)]


def advice(payload: Mapping[str, Any]) -> list[Advice]:
    """The study's row of the "What to use" table."""
    verdicts, helped = _helped(payload)
    when = (
        f"you expect {listed(helped)} at test time (text classifiers)"
        if helped
        else "not at this scale: it bought no robustness over plain ERM, which is simpler"
    )
    # The advice rests on the shifts that helped, or (advising against) on those that did not.
    rests_on = [
        key for key, v in verdicts.items() if v == ("reproduced" if helped else "not reproduced")
    ]
    text = payload["data"]["text"]["selected"]["constrained"]
    setting = f"text: {strength(text)}; {payload['config']['text_steps']} training steps"
    keys = [*verdicts, CLEAN_PAPER_KEY, CLEAN_KEY]
    others = [key for group in GROUPS.values() for key in group]
    every = [key for key in [*keys, *others] if key in claims_by_key(payload)]
    open_parts = []
    if any(verdict_of(payload, k) == "inconclusive" for k in (CLEAN_PAPER_KEY, CLEAN_KEY)):
        open_parts.append("clean-accuracy parity (needs more seeds or test sentences)")
    groups = [
        g
        for g, group in GROUPS.items()
        if set(verdicts_of(payload, group).values()) == {"untested"}
    ]
    if groups:
        open_parts.append(f"the claims on {listed(groups)} (untested)")
    unknown = "; ".join(open_parts) or "larger models"
    return [
        Advice(
            "Layer-wise descent constraints",
            when,
            setting,
            tuple(every),
            unknown,
            scale="pretrained MiniLM-L6 (6 layers, d_model 384) fine-tuned on rt-sentences",
            rests_on=tuple(rests_on),
            selections=(TEXT_TUNING,),
        )
    ]
