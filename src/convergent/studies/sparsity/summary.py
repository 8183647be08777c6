"""The ``sparsity`` study's plain summary: what was tested, what a user should do, what stays
unknown, written from a ``results.json`` payload's verdicts and numbers alone.

Five sentences: the scale; the language model's one-shot claims (every pruner and target); when HORST is worth using there and at what
strength, in HORST's own unit (``HORST(strength=r)``: alpha x mean |theta| at the first step,
about the first step's mirror/Adam move ratio); the ViT claims against HAM and the claims on
weights near zero; the ViT claims against AdamW. Each phrase is chosen by its claim's verdict,
so a rescored or re-run result rewrites its own summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.framework import Sentence, check_design, listed, stored_number, verdict_of
from convergent.studies.sparsity.checks import PRUNER_NAMES
from convergent.studies.sparsity.claims import DESIGN, HIGH_SPARSITY
from convergent.studies.sparsity.config import LM_SELECTION_PRUNER, sparsity_key
from convergent.studies.sparsity.wording import (
    Role,
    by_role,
    effect_with_interval,
    key_shown,
    one_shot_claims,
    percent_shown,
    role_claim,
    role_keys,
    rounded,
    stored_mean,
    verdict_phrase,
    why_untested,
)

AXIS_NAMES = {"lr": "learning rate", "weight_decay": "weight decay"}

# The phrases chosen by a claim's verdict, filled with the sentence's fields.
NEAR_ZERO_WORDS = {
    "reproduced": "HORST's unpruned {where} weights were more concentrated near zero than AdamW's",
    "not reproduced": "HORST's unpruned {where} weights were less concentrated near zero than "
    "AdamW's",
    "inconclusive": "these seeds cannot tell whether HORST's unpruned {where} weights sit nearer "
    "zero than AdamW's",
    "untested": "whether HORST's {where} weights sit nearer zero is not known ({why})",
}
HAM_WORDS = {
    "reproduced": "HORST beat HAM",
    "not reproduced": "HORST did worse than HAM{setting}, so prefer HAM there",
    "inconclusive": "these seeds cannot tell HORST from HAM",
    "untested": "HORST against HAM is not known ({why})",
}
ADAMW_WORDS = {
    Role.BEATS_ADAMW: {
        "what": "HORST reaches a higher accuracy than AdamW at {top}",
        "reproduced": "HORST beat AdamW at {top}",
        "not reproduced": "HORST did worse than AdamW at {top}, so prefer AdamW there",
        "inconclusive": "these seeds cannot tell HORST from AdamW at {top}",
        "effect": "HORST's top-1 accuracy minus AdamW's",
    },
    Role.HALF_THE_LOSS: {
        "what": "HORST loses at most half the accuracy AdamW loses at {high}",
        "reproduced": "HORST lost at most half the accuracy AdamW lost at {high}",
        "not reproduced": "HORST lost more than half the accuracy AdamW lost at {high}",
        "inconclusive": "these seeds cannot tell whether HORST loses at most half the accuracy "
        "AdamW loses at {high}",
        "effect": "accuracy HORST lost minus half what AdamW lost",
    },
}

# Public here: the summary, and the claim roles' keys it reads (`wording.role_keys`).
__all__ = ["role_keys", "summary"]


def summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The study's summary sentences from its ``results.json`` payload (this design's only)."""
    check_design("sparsity", payload["data"].get("design"), DESIGN)
    sentences = [_scale(payload)]
    for write in (_language, _strength, _vision_against_ham, _vision_against_adamw):
        sentence = write(payload)
        if sentence is not None:
            sentences.append(sentence)
    return sentences


def _grid_note(payload: Mapping[str, Any], part: str, optimizer: str) -> str:
    """Where the selected point of ``optimizer`` lies in its grid of tuning ``part``: '' inside,
    else which end of which axis, e.g. "alpha 3 was the smallest tried, so a smaller one may
    do better"."""
    for title, records in payload["tuning"].items():
        if not title.startswith(part) or optimizer not in records:
            continue
        record = records[optimizer]
        ends = []
        for axis in record.get("on_edge", []):
            value = record["selected"][axis]
            low = value == min(record["grid"][axis])
            shown = AXIS_NAMES.get(axis, axis)
            ends.append(
                f"{shown} {value:g} was the {'smallest' if low else 'largest'} tried, so a "
                f"{'smaller' if low else 'larger'} one may do better"
            )
        return "; ".join(ends)
    return ""


def _scale(payload: Mapping[str, Any]) -> Sentence:
    config = payload["config"]
    seeds = config["seeds"]
    sizes = {
        title[:3]: sorted({len(record["points"]) for record in records.values()})
        for title, records in payload["tuning"].items()
    }
    grid = ", ".join(
        f"{' or '.join(map(str, counts))} settings for the {what}"
        for part, what in (("(a)", "vision model"), ("(b)", "language model"))
        if (counts := sizes.get(part))
    )
    sparsities = listed([f"{round(100 * t)}" for t in config["sparsities"]])
    lm_sparsities = listed([f"{round(100 * t)}" for t in config["lm_sparsities"]])
    pruners = listed([PRUNER_NAMES[p] for p in config["lm_pruners"]])
    calibrated = [PRUNER_NAMES[p] for p in config["lm_pruners"] if p != "magnitude"]
    calibration = (
        f" ({listed(calibrated)} calibrated on {config['lm_calibration_windows']} training windows)"
        if calibrated
        else ""
    )
    return Sentence(
        f"Tested at small scale: a {config['vit_layers']}-layer vision transformer (width "
        f"{config['vit_d_model']}) trained for {config['vit_steps']} steps on Fashion-MNIST and "
        f"pruned during training with AC/DC to {sparsities} % sparsity, and a "
        f"{config['lm_layers']}-layer character language model (width {config['lm_d_model']}) "
        f"trained for {config['lm_steps']} steps on Jane Austen's novels and pruned once after "
        f"training by {pruners}{calibration} to {lm_sparsities} %; each optimizer was tuned on "
        f"a grid of the same size ({grid}) with seed {config['selection_seed']} and then scored "
        f"on {len(seeds)} other seed{'s' if len(seeds) != 1 else ''}."
    )


def _setting(record: Mapping[str, Any]) -> str:
    """A one-shot claim's pruner and target in words: ``"SparseGPT at 70 %"``."""
    extra = record["extra"]
    return f"{PRUNER_NAMES[extra['pruner']]} at {key_shown(extra['sparsity'])}"


def _language(payload: Mapping[str, Any]) -> Sentence | None:
    found = one_shot_claims(payload)
    if not found:
        return None
    verdicts = {name: verdict_of(payload, name) for name, _ in found}
    counts = {v: list(verdicts.values()).count(v) for v in set(verdicts.values())}
    total = len(found)
    if counts.get("untested") == total:
        lead = (
            "Whether HORST helps a model you will prune once after training is not known from "
            f"this run ({why_untested(found[0][1])})"
        )
    elif counts.get("reproduced") == total:
        lead = "For a model you will prune once after training, HORST helped with every pruner"
    elif counts.get("reproduced"):
        lead = (
            "For a model you will prune once after training, HORST helped in "
            f"{counts['reproduced']} of the {total} settings"
        )
    elif counts.get("not reproduced"):
        lead = (
            "For a model you will prune once after training, HORST did worse than AdamW in "
            f"{counts['not reproduced']} of the {total} settings and helped in none"
        )
    else:
        lead = (
            "For a model you will prune once after training, these seeds cannot tell HORST "
            "from AdamW"
        )
    ratios = "; ".join(
        f"{effect_with_interval(record)} after {_setting(record)} ({verdict_phrase(payload, name)})"
        for name, record in found
    )
    perplexity = payload["data"]["language"]["perplexity"]
    dense = {m: stored_mean(by[LM_SELECTION_PRUNER]["0%"]) for m, by in perplexity.items()}
    text = (
        f"{lead}: the HORST-trained language model's test perplexity over the AdamW-trained "
        f"one's was {ratios} (unpruned: {rounded(dense['horst'], 3)} against "
        f"{rounded(dense['adamw'], 3)})"
    )
    return Sentence(f"{text}.", verdicts)


def _strength(payload: Mapping[str, Any]) -> Sentence | None:
    found = one_shot_claims(payload)
    language = payload["data"]["language"]
    if not found or "horst" not in language["selected"]:
        return None
    verdicts = {name: verdict_of(payload, name) for name, _ in found}
    selected = language["selected"]["horst"]
    strength = rounded(stored_mean(language["strength"]["horst"]))
    ratio = rounded(stored_mean(language["move_ratio"]["horst"]))
    edge = _grid_note(payload, "(b)", "horst")
    where = (
        f"HORST(strength={strength}), which is alpha {selected['alpha']:g} on these weights, "
        f"with learning rate {selected['lr']:g}" + (f" ({edge})" if edge else "")
    )
    moved = f"over the run its mirror step moved the weights about {ratio} times as far as its "
    helped = [_setting(record) for name, record in found if verdicts[name] == "reproduced"]
    values = set(verdicts.values())
    if helped:
        settings = (
            "(it helped with every pruner and target tested)"
            if len(helped) == len(found)
            else f"with the pruners and targets where it helped ({listed(helped)})"
        )
        lead = (
            f"Train with HORST a model you will prune once after training {settings}, at the "
            f"strength selected here, {where}; {moved}Adam step"
        )
    elif "not reproduced" in values:
        lead = (
            f"Keep AdamW for one-shot pruning: HORST acted ({where}; {moved}Adam step) and did "
            "not pay"
        )
    elif values == {"untested"}:
        lead = (
            f"A fair test needs a stronger HORST: at {where}, {moved}Adam step, below the 0.2 "
            "the test needs"
        )
    else:
        lead = (
            "Before choosing HORST for one-shot pruning, run more seeds or a larger test set; "
            f"it ran at {where}, and {moved}Adam step"
        )
    return Sentence(
        f"{lead}; HORST's strength is alpha x mean |theta|, about the first step's mirror/Adam "
        "move ratio (the ratio then grows as HORST spreads the weights), so on another model "
        f"pass strength={strength} rather than copying alpha {selected['alpha']:g}.",
        verdicts,
    )


def _near_zero_part(payload: Mapping[str, Any], part: Role, where: str) -> tuple[str, str] | None:
    found = role_claim(payload, part)
    if found is None:
        return None
    name, record = found
    verdict = verdict_of(payload, name)
    lead = NEAR_ZERO_WORDS[verdict].format(where=where, why=why_untested(record))
    fraction = stored_number(payload["data"].get("rms_fraction"))
    return name, (
        f"{lead} (share below {rounded(100 * fraction)} % of their tensor's RMS, HORST minus "
        f"AdamW: {effect_with_interval(record, 100)} percentage points; {verdict_phrase(payload, name)})"
    )


def _vision_against_ham(payload: Mapping[str, Any]) -> Sentence | None:
    parts, verdicts = [], {}
    near_zero = []
    found = role_claim(payload, Role.BEATS_HAM)
    highest = max(payload["config"]["sparsities"])
    top = percent_shown(highest)
    vision = payload["data"]["vision"]
    if found is not None:
        name, record = found
        verdict = verdicts[name] = verdict_of(payload, name)
        ham = vision["selected"].get("ham", {})
        setting = (
            f" (alpha {ham['alpha']:g} with learning rate {ham['lr']:g} selected)"
            if {"alpha", "lr"} <= set(ham)
            else ""
        )
        lead = HAM_WORDS[verdict].format(setting=setting, why=why_untested(record, top))
        parts.append(
            f"Training the vision transformer with AC/DC, {lead}: at {top} sparsity HORST's "
            f"top-1 accuracy minus HAM's was {effect_with_interval(record, 100)} points "
            f"({verdict_phrase(payload, name)})"
        )
    for part, where in (
        (Role.NEAR_ZERO_VIT, "vision-transformer"),
        (Role.NEAR_ZERO_LM, "language-model"),
    ):
        near = _near_zero_part(payload, part, where)
        if near is not None:
            verdicts[near[0]] = verdict_of(payload, near[0])
            near_zero.append(near[1])
    if near_zero:
        parts.append(" and ".join(near_zero))
    if not parts:
        return None
    horst = vision["selected"].get("horst", {})
    ratio = stored_mean(vision["move_ratio"].get("horst", {}).get(sparsity_key(highest), []))
    strength = stored_mean(vision["strength"].get("horst", []))
    edge = _grid_note(payload, "(a)", "horst")
    acted = ""
    if "alpha" in horst and math.isfinite(ratio):
        moved = "acted, moving" if ratio >= acting.MOVE_RATIO_FLOOR else "barely acted, moving only"
        acted = (
            f"; on the vision transformer HORST's mirror step {moved} the weights about "
            f"{rounded(ratio)} times as far as its Adam step at its selected alpha "
            f"{horst['alpha']:g} (strength {rounded(strength)})" + (f" ({edge})" if edge else "")
        )
    text = "; ".join(parts)
    return Sentence(f"{text[0].upper()}{text[1:]}{acted}.", verdicts)


def _vision_against_adamw(payload: Mapping[str, Any]) -> Sentence | None:
    found = [
        c
        for c in (role_claim(payload, Role.BEATS_ADAMW), role_claim(payload, Role.HALF_THE_LOSS))
        if c
    ]
    if not found:
        return None
    sparsities = payload["config"]["sparsities"]
    top = percent_shown(max(sparsities))
    high = "-".join(f"{round(100 * t)}" for t in sparsities if t >= HIGH_SPARSITY - 1e-9) + " %"
    verdicts = {name: verdict_of(payload, name) for name, _ in found}
    unknown = [(n, r) for n, r in found if verdicts[n] == "untested"]
    parts = []
    if unknown:
        claims = " and whether ".join(
            by_role(payload, ADAMW_WORDS, name)["what"].format(top=top, high=high)
            for name, _ in unknown
        )
        reasons = list(dict.fromkeys(why_untested(record, top) for _, record in unknown))
        stays = "stay" if len(unknown) > 1 else "stays"
        parts.append(f"whether {claims} {stays} untested: {'; '.join(reasons)}")
    for name, record in found:
        if verdicts[name] != "untested":
            words = by_role(payload, ADAMW_WORDS, name)
            parts.append(
                f"{words[verdicts[name]].format(top=top, high=high)} ({words['effect']}: "
                f"{effect_with_interval(record, 100)} points; {verdict_phrase(payload, name)})"
            )
    return Sentence(f"Under AC/DC, {'; and '.join(parts)}.", verdicts)
