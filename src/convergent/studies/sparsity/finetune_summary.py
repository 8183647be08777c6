"""Part (c)'s plain sentences and its "What to use" row, from a ``results.json`` payload's
verdicts and numbers alone (none where the payload holds no part (c))."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convergent.studies.framework import (
    NOT_ESTABLISHED,
    Advice,
    Sentence,
    claims_by_key,
    established,
    listed,
    verdicts_of,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.sparsity.finetune_claims import (
    DENSE_KEY,
    STRONGER,
    finetune_key,
    shown_variant,
)
from convergent.studies.sparsity.finetune_config import FINETUNE_TUNING


def _keys(payload: Mapping[str, Any]) -> list[str]:
    finetune = payload["data"].get("finetune")
    if finetune is None:
        return []
    held = claims_by_key(payload)
    return [key for key in map(finetune_key, finetune["variants"]) if key in held]


def _strength(payload: Mapping[str, Any]) -> str:
    point = payload["data"]["finetune"]["selected"]["horst"]
    return f"HORST(strength={point['strength']:g}, lr={point['lr']:g})"


def _points(record: Mapping[str, Any]) -> str:
    return f"{100 * number(record['effect']):+.1f} points"


def _scored(
    payload: Mapping[str, Any],
) -> tuple[list[str], dict[str, Any], dict[str, str]] | None:
    """Part (c)'s pruned claims' keys, the claims by key and the verdicts (the dense claim's
    too); None where the payload holds no part (c)."""
    keys = _keys(payload)
    if not keys:
        return None
    return keys, claims_by_key(payload), verdicts_of(payload, [*keys, DENSE_KEY])


def finetune_sentences(payload: Mapping[str, Any]) -> list[Sentence]:
    """One action-first sentence: which pruned settings a HORST fine-tune helped in (with its
    gain in points), or that it gave no gain here; and the dense comparison."""
    scored = _scored(payload)
    if scored is None:
        return []
    keys, claims, verdicts = scored
    helped = [key for key in keys if verdicts[key] == "reproduced"]
    worse = [key for key in keys if verdicts[key] == "not reproduced"]
    untested = [key for key in keys if verdicts[key] == "untested"]

    def shown(found: list[str]) -> str:
        return listed(
            [
                f"{shown_variant(claims[k]['extra']['variant'])} ({_points(claims[k])})"
                for k in found
            ]
        )

    sure = [key for key in helped if established(claims[key])]
    if sure:
        lead = (
            f"Fine-tune a pretrained model with {_strength(payload)} before pruning with "
            f"{shown(sure)}: it kept that much more test accuracy than an AdamW fine-tune"
        )
    elif helped:
        size = claims[helped[0]]["holm"]["size"]
        lead = (
            f"A fine-tune with {_strength(payload)} kept more test accuracy than an AdamW "
            f"fine-tune after {shown(helped)}, but not after Holm over the {size} claims tested "
            f"together: {NOT_ESTABLISHED}"
        )
    elif len(untested) < len(keys):
        lead = "No gain from a HORST fine-tune before pruning at this scale (MiniLM-L6)"
    else:
        lead = (
            "Whether a HORST fine-tune helps before pruning is not known from this run: a "
            "manipulation check failed in every pruned setting (see the claims table)"
        )
    rest = []
    if worse:
        rest.append(f"it did worse after {shown(worse)}")
    open_ = len(keys) - len(helped) - len(worse) - len(untested)
    if open_:
        rest.append(f"{open_} of the {len(keys)} pruned settings were inconclusive")
    if untested and len(untested) < len(keys):
        rest.append(f"{len(untested)} untested (a check failed)")
    dense = verdicts.get(DENSE_KEY)
    if dense is not None:
        rest.append(
            "dense accuracy stayed within 2 points"
            if dense == "reproduced"
            else f"dense accuracy within 2 points: {dense}"
        )
    text = f"(c) {lead}" + (f"; {'; '.join(rest)}" if rest else "") + "."
    return [Sentence(text, verdicts)]


def finetune_brief(payload: Mapping[str, Any]) -> list[Sentence]:
    """The README's sentence on part (c): the report's, without numbers (they are in the
    tables): where a HORST fine-tune helped, and that the rest stays open."""
    scored = _scored(payload)
    if scored is None:
        return []
    keys, claims, verdicts = scored
    helped = [key for key in keys if verdicts[key] == "reproduced"]
    if not helped:
        return finetune_sentences(payload)
    dense = verdicts.get(DENSE_KEY)
    same = f", at the same dense accuracy ({dense})" if dense is not None else ""
    rest = len(keys) - len(helped)
    others = f"; not shown for the other {rest} pruned settings" if rest else ""
    sure = [key for key in helped if established(claims[key])]
    settings = listed([shown_variant(claims[k]["extra"]["variant"]) for k in sure or helped])
    if sure:
        lead = (
            f"Fine-tune with HORST before pruning with {settings}: it kept more accuracy than "
            f"AdamW (reproduced){same}"
        )
    else:
        size = claims[helped[0]]["holm"]["size"]
        lead = (
            f"After {settings}, a HORST fine-tune kept more accuracy than AdamW (reproduced, "
            f"but not after Holm over {size} claims: {NOT_ESTABLISHED}){same}"
        )
    return [Sentence(f"(c) {lead}{others}.", verdicts)]


def finetune_advice(payload: Mapping[str, Any]) -> list[Advice]:
    """The "What to use" row of part (c)."""
    keys = _keys(payload)
    if not keys:
        return []
    claims = claims_by_key(payload)
    verdicts = verdicts_of(payload, keys)
    rests_on = [k for k in keys if verdicts[k] == "reproduced"]
    helped = [claims[k]["extra"]["variant"] for k in rests_on]
    when = (
        f"you will prune a fine-tuned model with {listed([shown_variant(v) for v in helped])}"
        if helped
        else "not shown to help here: fine-tune with AdamW"
    )
    strongest = claims.get(finetune_key(STRONGER))
    unknown = "models larger than MiniLM-L6; tasks beyond sentiment"
    if strongest is not None and verdicts.get(finetune_key(STRONGER)) != "reproduced":
        unknown = f"whether it helps before SparseGPT to 70 % ({verdicts[finetune_key(STRONGER)]})"
    return [
        Advice(
            "HORST fine-tune, then one-shot pruning",
            when,
            f"{_strength(payload)} for the fine-tune, against AdamW",
            (*keys, DENSE_KEY) if DENSE_KEY in claims else tuple(keys),
            unknown,
            scale="pretrained MiniLM-L6 (6 layers, d_model 384) fine-tuned on rt-sentences",
            rests_on=tuple(rests_on),
            selections=(FINETUNE_TUNING,),
        )
    ]
