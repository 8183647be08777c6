"""What the ``sparsity`` study tells a user in a minute: HORST before one-shot pruning, its
weights near zero, AC/DC left open (the README summary), and its two "What to use" rows; the
report keeps the long findings (`summary`)."""

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
    verdict_words,
    verdicts_of,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.sparsity import finetune_config as part_c
from convergent.studies.sparsity.checks import PRUNER_NAMES
from convergent.studies.sparsity.config import LANGUAGE_TUNING, VISION_TUNING, sparsity_key
from convergent.studies.sparsity.wording import (
    Role,
    one_shot_claims,
    role_keys,
    rounded,
    stored_mean,
    why_untested,
)

ACDC_ROLES = (Role.BEATS_ADAMW, Role.BEATS_HAM, Role.HALF_THE_LOSS)


def _present(payload: Mapping[str, Any], roles: tuple[Role, ...]) -> list[str]:
    """The keys of ``roles``' claims that the results hold, in that order."""
    keys, claims = role_keys(payload), claims_by_key(payload)
    return [keys[role] for role in roles if keys[role] in claims]


def _one_shot_keys(payload: Mapping[str, Any]) -> list[str]:
    return [key for key, _ in one_shot_claims(payload)]


def _one_shot_sentence(payload: Mapping[str, Any]) -> Sentence | None:
    verdicts = verdicts_of(payload, _one_shot_keys(payload))
    if not verdicts:
        return None
    held = set(verdicts.values())
    words = verdict_words(list(verdicts.values()))
    if held == {"reproduced"}:
        text = (
            "Train with HORST a small model you will prune once after training: on a "
            "character LM trained from scratch it kept a lower perplexity than AdamW after "
            f"every pruner and target tested ({words})."
        )
    elif "reproduced" in held:
        text = (
            "Train with HORST a model you will prune once, with the pruners and targets where "
            f"it kept a lower perplexity than AdamW ({words}; the report lists which)."
        )
    elif "not reproduced" in held:
        text = f"Keep AdamW for one-shot pruning: HORST did not pay ({words})."
    else:
        text = f"Whether HORST helps one-shot pruning stays open here ({words})."
    return Sentence(text, verdicts)


def _near_zero_sentence(payload: Mapping[str, Any]) -> Sentence | None:
    verdicts = verdicts_of(payload, _present(payload, (Role.NEAR_ZERO_VIT, Role.NEAR_ZERO_LM)))
    if not verdicts:
        return None
    words = verdict_words(list(verdicts.values()))
    held = set(verdicts.values())
    lead = (
        "HORST's weights sat nearer zero than AdamW's in both models"
        if held == {"reproduced"}
        else "Whether HORST's weights sit nearer zero than AdamW's varied by model"
    )
    return Sentence(f"{lead} ({words}).", verdicts)


def _acdc_sentence(payload: Mapping[str, Any]) -> Sentence | None:
    verdicts = verdicts_of(payload, _present(payload, ACDC_ROLES))
    if not verdicts:
        return None
    words = verdict_words(list(verdicts.values()))
    held = set(verdicts.values())
    if held == {"untested"}:
        text = (
            "For sparse training with AC/DC, keep AdamW or HAM: whether HORST beats them stays "
            f"untested, as the baselines lost too little accuracy to leave room ({words})."
        )
    elif held == {"reproduced"}:
        text = f"For sparse training with AC/DC, HORST beat AdamW and HAM ({words})."
    else:
        text = f"For sparse training with AC/DC, HORST's claims came out mixed ({words})."
    return Sentence(text, verdicts)


def brief(payload: Mapping[str, Any]) -> list[Sentence]:
    """The README summary: what to do for one-shot pruning, what HORST does to the weights,
    and what stays unknown under AC/DC."""
    found = (_one_shot_sentence(payload), _near_zero_sentence(payload), _acdc_sentence(payload))
    return [sentence for sentence in found if sentence is not None]


def _one_shot_row(payload: Mapping[str, Any]) -> Advice | None:
    keys = _one_shot_keys(payload)
    language = payload["data"]["language"]
    if not keys or "horst" not in language["selected"]:
        return None
    verdicts = verdicts_of(payload, keys)
    claims = claims_by_key(payload)
    rests_on = [key for key, _ in one_shot_claims(payload) if verdicts[key] == "reproduced"]
    helped = [
        f"{PRUNER_NAMES[claims[key]['extra']['pruner']]} at {claims[key]['extra']['sparsity']}"
        for key in rests_on
    ]
    everywhere = len(helped) == len(one_shot_claims(payload))
    when = (
        "you train a small model from scratch and will prune it once (magnitude, Wanda or "
        "SparseGPT); for a pretrained model, see the HORST fine-tune row"
        if everywhere
        else f"you will prune once with {listed(helped)}"
        if helped
        else "not shown to help here: keep AdamW"
    )
    selected = language["selected"]["horst"]
    strength = rounded(stored_mean(language["strength"]["horst"]))
    targets = list(
        dict.fromkeys(claims[key]["extra"]["sparsity"] for key, _ in one_shot_claims(payload))
    )
    setting = (
        f"HORST(strength={strength}) (alpha {selected['alpha']:g} on these weights), "
        f"learning rate {selected['lr']:g}; pruned to {listed(targets)} sparsity"
    )
    unknown = "models beyond a 2-layer character LM; pruners beyond the three tested"
    near_lm = _present(payload, (Role.NEAR_ZERO_LM,))
    config = payload["config"]
    return Advice(
        "HORST, then one-shot pruning",
        when,
        setting,
        tuple(keys + near_lm),
        unknown,
        scale=(
            f"a {config['lm_layers']}-layer character LM (d_model {config['lm_d_model']}) "
            "trained from scratch on Austen"
        ),
        rests_on=tuple(rests_on),
        selections=(LANGUAGE_TUNING,),
    )


def _acdc_row(payload: Mapping[str, Any]) -> Advice | None:
    keys = _present(payload, ACDC_ROLES)
    vision = payload["data"]["vision"]
    if not keys or "horst" not in vision["selected"]:
        return None
    verdicts = verdicts_of(payload, keys)
    claims = claims_by_key(payload)
    held = set(verdicts.values())
    top = sparsity_key(max(payload["config"]["sparsities"]))
    when = {
        frozenset({"reproduced"}): f"training sparse with AC/DC (up to {top})",
        frozenset({"untested"}): "not known: keep AdamW or HAM",
    }.get(frozenset(held), "not settled here: keep AdamW or HAM")
    horst = vision["selected"]["horst"]
    strength = rounded(stored_mean(vision["strength"].get("horst", [])))
    sparsities = [sparsity_key(t) for t in payload["config"]["sparsities"]]
    setting = (
        f"HORST alpha {horst['alpha']:g} (strength {strength}), learning rate "
        f"{horst['lr']:g}; AC/DC to {listed(sparsities)} sparsity"
    )
    untested = [key for key in keys if verdicts[key] == "untested"]
    unknown = (
        "whether HORST beats AdamW or HAM: " + why_untested(claims[untested[0]], top)
        if untested
        else "larger vision models"
    )
    config = payload["config"]
    return Advice(
        "HORST under AC/DC sparse training",
        when,
        setting,
        tuple(keys + _present(payload, (Role.NEAR_ZERO_VIT,))),
        unknown,
        scale=(
            f"a {config['vit_layers']}-layer ViT (d_model {config['vit_d_model']}) on Fashion-MNIST"
        ),
        rests_on=tuple(keys) if held == {"reproduced"} else (),
        selections=(VISION_TUNING,),
    )


def advice(payload: Mapping[str, Any]) -> list[Advice]:
    """The study's rows of the "What to use" table."""
    return [row for row in (_one_shot_row(payload), _acdc_row(payload)) if row is not None]


def _finetune_scored(payload: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]] | None:
    """Part (c)'s pruned claims' keys and the claims by key; None without part (c)."""
    finetune, claims = payload["data"].get("finetune"), claims_by_key(payload)
    keys = [part_c.finetune_key(v) for v in finetune["variants"]] if finetune else []
    keys = [key for key in keys if key in claims]
    return (keys, claims) if keys else None


def _finetune_fields(payload: Mapping[str, Any], claims: Mapping[str, Any]) -> dict[str, Any]:
    """What part (c)'s words are filled with, besides the listed settings."""
    point = payload["data"]["finetune"]["selected"]["horst"]
    any_claim = next(iter(claims.values()))
    return {
        "setting": part_c.WORDS["setting"].format(**point),
        "size": (any_claim.get("holm") or {}).get("size"),
        "not_established": NOT_ESTABLISHED,
    }


def _shown(claims: Mapping[str, Any], keys: list[str], points: bool = False) -> str:
    return listed(
        [
            part_c.shown_variant(claims[key]["extra"]["variant"])
            + (f" ({100 * number(claims[key]['effect']):+.1f} points)" if points else "")
            for key in keys
        ]
    )


def finetune_sentences(payload: Mapping[str, Any]) -> list[Sentence]:
    """Part (c)'s sentence for the report: where a HORST fine-tune helped (with its gain in
    points) or that it gave no gain here, the rest by verdict, and the dense comparison."""
    scored = _finetune_scored(payload)
    if scored is None:
        return []
    keys, claims = scored
    words, verdicts = part_c.WORDS, verdicts_of(payload, [*keys, part_c.DENSE_KEY])
    helped, worse, untested = (
        [key for key in keys if verdicts[key] == verdict]
        for verdict in ("reproduced", "not reproduced", "untested")
    )
    sure = [key for key in helped if established(claims[key])]
    fields = _finetune_fields(payload, {k: claims[k] for k in helped or keys})
    if sure or helped:
        lead = words["sure" if sure else "helped"]
        lead = lead.format(**fields, shown=_shown(claims, sure or helped, True))
    else:
        lead = words["no gain" if len(untested) < len(keys) else "unknown"]
    rest = [words["worse"].format(shown=_shown(claims, worse, True))] if worse else []
    open_ = len(keys) - len(helped) - len(worse) - len(untested)
    if open_:
        rest.append(words["open"].format(count=open_, total=len(keys)))
    if untested and len(untested) < len(keys):
        rest.append(words["untested"].format(count=len(untested)))
    dense = verdicts.get(part_c.DENSE_KEY)
    if dense is not None:
        rest.append(words["dense same" if dense == "reproduced" else "dense other"])
        rest[-1] = rest[-1].format(verdict=dense)
    text = f"(c) {lead}" + (f"; {'; '.join(rest)}" if rest else "") + "."
    return [Sentence(text, verdicts)]


def finetune_brief(payload: Mapping[str, Any]) -> list[Sentence]:
    """The README's sentence on part (c): the report's without numbers (they are in the
    tables), or the report's where nothing helped."""
    scored = _finetune_scored(payload)
    if scored is None:
        return []
    keys, claims = scored
    words, verdicts = part_c.WORDS, verdicts_of(payload, [*keys, part_c.DENSE_KEY])
    helped = [key for key in keys if verdicts[key] == "reproduced"]
    if not helped:
        return finetune_sentences(payload)
    dense = verdicts.get(part_c.DENSE_KEY)
    same = words["brief same"].format(verdict=dense) if dense is not None else ""
    rest = len(keys) - len(helped)
    sure = [key for key in helped if established(claims[key])]
    lead = words["brief sure" if sure else "brief helped"].format(
        **_finetune_fields(payload, {k: claims[k] for k in helped}),
        shown=_shown(claims, sure or helped),
        same=same,
    )
    others = words["brief others"].format(count=rest) if rest else ""
    return [Sentence(f"(c) {lead}{others}.", verdicts)]


def finetune_advice(payload: Mapping[str, Any]) -> list[Advice]:
    """The "What to use" row of part (c)."""
    scored = _finetune_scored(payload)
    if scored is None:
        return []
    keys, claims = scored
    words, verdicts = part_c.WORDS, verdicts_of(payload, keys)
    rests_on = [key for key in keys if verdicts[key] == "reproduced"]
    when = words["advice helped" if rests_on else "advice none"]
    stronger = part_c.finetune_key(part_c.STRONGER)
    unknown = words["advice unknown"]
    if stronger in claims and verdicts.get(stronger) != "reproduced":
        unknown = words["advice stronger"].format(verdict=verdicts[stronger])
    fields = _finetune_fields(payload, claims)
    return [
        Advice(
            words["advice method"],
            when.format(shown=_shown(claims, rests_on)),
            words["advice setting"].format(**fields),
            (*keys, part_c.DENSE_KEY) if part_c.DENSE_KEY in claims else tuple(keys),
            unknown,
            scale=words["advice scale"],
            rests_on=tuple(rests_on),
            selections=(part_c.FINETUNE_TUNING,),
        )
    ]
