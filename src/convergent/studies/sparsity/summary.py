"""The ``sparsity`` study's plain summary: what was tested, what a user should do, what stays
unknown, written from a ``results.json`` payload's verdicts and numbers alone.

Five sentences: the scale; the language model's one-shot claims (every pruner and target, and
whether HORST's advantage survives SparseGPT); when HORST is worth using there and at what
strength, in HORST's own unit (``HORST(strength=r)``: alpha x mean |theta| at the first step,
about the first step's mirror/Adam move ratio); the ViT claims against HAM and the claims on
weights near zero; the ViT claims against AdamW. Each phrase is chosen by its claim's verdict,
so a rescored or re-run result rewrites its own summary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.framework import (
    Sentence,
    check_design,
    claims_by_key,
    finite_mean,
    stored_number,
    verdict_of,
)
from convergent.studies.sparsity.claims import (
    ADVANTAGE_CHECK,
    DESIGN,
    FLOOR_CHECK,
    HIGH_SPARSITY,
    PRUNER_NAMES,
    STRONGER_PRUNER,
    STRONGER_TARGET,
    half_loss_key,
    near_zero_key,
    pruned_key,
    vision_key,
)
from convergent.studies.sparsity.config import LM_SELECTION_PRUNER, sparsity_key

# The role of each claim a sentence reads (`role_keys` gives its key for a payload's config).
BEATS_ADAMW, BEATS_HAM, HALF_THE_LOSS = "beats AdamW", "beats HAM", "half the loss"
NEAR_ZERO_VIT, NEAR_ZERO_LM, SURVIVES = "near zero, ViT", "near zero, LM", "survives"
AXIS_NAMES = {"lr": "learning rate", "weight_decay": "weight decay"}


def summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The study's summary sentences from its ``results.json`` payload (this design's only)."""
    check_design("sparsity", payload["data"].get("design"), DESIGN)
    sentences = [_scale(payload)]
    for write in (_language, _strength, _vision_against_ham, _vision_against_adamw):
        sentence = write(payload)
        if sentence is not None:
            sentences.append(sentence)
    return sentences


def role_keys(payload: Mapping[str, Any]) -> dict[str, str]:
    """The key of each role's claim under the payload's config (the claims' own key builders,
    given the sparsities the claims read)."""
    config = payload["config"]
    top = sparsity_key(max(config["sparsities"]))
    high = [sparsity_key(t) for t in config["sparsities"] if t >= HIGH_SPARSITY - 1e-9]
    return {
        BEATS_ADAMW: vision_key("adamw", top),
        BEATS_HAM: vision_key("ham", top),
        HALF_THE_LOSS: half_loss_key(high),
        NEAR_ZERO_VIT: near_zero_key("ViT"),
        NEAR_ZERO_LM: near_zero_key("character LM"),
        SURVIVES: pruned_key(STRONGER_PRUNER, sparsity_key(STRONGER_TARGET), survives=True),
    }


def _claim(payload: Mapping[str, Any], role: str) -> tuple[str, Mapping[str, Any]] | None:
    """The key and record of ``role``'s claim (None when the results hold none)."""
    key = role_keys(payload)[role]
    record = claims_by_key(payload).get(key)
    return None if record is None else (key, record)


def _one_shot(payload: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The one-shot claims (claim 5), one per pruner and target, in the payload's order."""
    config = payload["config"]
    keys = {
        pruned_key(pruner, sparsity_key(target))
        for pruner in config["lm_pruners"]
        for target in config["lm_sparsities"]
    }
    return [(key, record) for key, record in claims_by_key(payload).items() if key in keys]


def _number(value: Any, digits: int = 2) -> str:
    """``value`` to ``digits`` significant digits (at least to the units), "n/a" if missing."""
    value = stored_number(value)
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{round(value, decimals):g}"


def _effect(record: Mapping[str, Any], scale: float = 1.0) -> str:
    """The claim's effect and 95 % interval, e.g. ``-2.3 [-3.6, -0.94]`` (times ``scale``)."""
    effect = stored_number(record["effect"]) * scale
    interval = record.get("interval")
    if not interval:
        return _number(effect)
    low, high = (stored_number(v) * scale for v in interval)
    return f"{_number(effect)} [{_number(low)}, {_number(high)}]"


def _verdict(payload: Mapping[str, Any], name: str) -> str:
    """The verdict as written in a sentence: ``reproduced``, or ``reproduced, a preview``."""
    preview = claims_by_key(payload)[name].get("preview")
    return verdict_of(payload, name) + (", a preview" if preview else "")


def _mean(values: Sequence[Any]) -> float:
    return finite_mean([stored_number(v) for v in values])


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


def _shown(fraction: float) -> str:
    """A sparsity as a sentence writes it: ``0.9 -> "90 %"``."""
    return f"{round(100 * fraction)} %"


def _key_shown(key: str) -> str:
    """A data key as a sentence writes it: ``"90%" -> "90 %"``."""
    return key.replace("%", " %")


def _listed(items: Sequence[str]) -> str:
    """``("50", "70", "90") -> "50, 70 and 90"``."""
    return " and ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else "".join(items)


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
    sparsities = _listed([f"{round(100 * t)}" for t in config["sparsities"]])
    lm_sparsities = _listed([f"{round(100 * t)}" for t in config["lm_sparsities"]])
    pruners = _listed([PRUNER_NAMES[p] for p in config["lm_pruners"]])
    calibrated = [PRUNER_NAMES[p] for p in config["lm_pruners"] if p != "magnitude"]
    calibration = (
        f" ({_listed(calibrated)} calibrated on {config['lm_calibration_windows']} training "
        "windows)"
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
    return f"{PRUNER_NAMES[extra['pruner']]} at {_key_shown(extra['sparsity'])}"


def _language(payload: Mapping[str, Any]) -> Sentence | None:
    found = _one_shot(payload)
    if not found:
        return None
    verdicts = {name: verdict_of(payload, name) for name, _ in found}
    counts = {v: list(verdicts.values()).count(v) for v in set(verdicts.values())}
    total = len(found)
    if counts.get("untested") == total:
        lead = (
            "Whether HORST helps a model you will prune once after training is not known from "
            f"this run ({_why_untested(found[0][1])})"
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
        f"{_effect(record)} after {_setting(record)} ({_verdict(payload, name)})"
        for name, record in found
    )
    perplexity = payload["data"]["language"]["perplexity"]
    dense = {m: _mean(by[LM_SELECTION_PRUNER]["0%"]) for m, by in perplexity.items()}
    text = (
        f"{lead}: the HORST-trained language model's test perplexity over the AdamW-trained "
        f"one's was {ratios} (unpruned: {_number(dense['horst'], 3)} against "
        f"{_number(dense['adamw'], 3)})"
    )
    survives = _claim(payload, SURVIVES)
    if survives is not None:
        name, record = survives
        verdict = verdicts[name] = verdict_of(payload, name)
        what = {
            "reproduced": "survived",
            "not reproduced": "did not survive",
            "inconclusive": "may or may not survive (these seeds cannot tell)",
            "untested": "is not known to survive",
        }[verdict]
        text += (
            f"; HORST's advantage {what} the stronger pruner, {_setting(record)} "
            f"({_verdict(payload, name)})"
        )
        if verdict == "untested":
            text += _no_advantage(record)
    return Sentence(f"{text}.", verdicts)


def _no_advantage(record: Mapping[str, Any]) -> str:
    """Why the survival claim is untested when its precondition failed (else nothing)."""
    for check in record.get("checks", []):
        if check["name"].startswith(ADVANTAGE_CHECK) and check.get("passed") is False:
            return (
                ": there was no clear advantage to survive, as after magnitude pruning to "
                f"{_key_shown(record['extra']['sparsity'])} the upper end of the ratio's 95 % "
                f"interval was {_number(stored_number(check.get('value')))} (at most 1 needed)"
            )
    return ""


def _strength(payload: Mapping[str, Any]) -> Sentence | None:
    found = _one_shot(payload)
    language = payload["data"]["language"]
    if not found or "horst" not in language["selected"]:
        return None
    verdicts = {name: verdict_of(payload, name) for name, _ in found}
    selected = language["selected"]["horst"]
    strength = _number(_mean(language["strength"]["horst"]))
    ratio = _number(_mean(language["move_ratio"]["horst"]))
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
            else f"with the pruners and targets where it helped ({_listed(helped)})"
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


def _near_zero_part(payload: Mapping[str, Any], part: str, where: str) -> tuple[str, str] | None:
    found = _claim(payload, part)
    if found is None:
        return None
    name, record = found
    verdict = verdict_of(payload, name)
    lead = {
        "reproduced": f"HORST's unpruned {where} weights were more concentrated near zero than "
        "AdamW's",
        "not reproduced": f"HORST's unpruned {where} weights were less concentrated near zero "
        "than AdamW's",
        "inconclusive": f"these seeds cannot tell whether HORST's unpruned {where} weights sit "
        "nearer zero than AdamW's",
        "untested": f"whether HORST's {where} weights sit nearer zero is not known "
        f"({_why_untested(record)})",
    }[verdict]
    fraction = stored_number(payload["data"].get("rms_fraction"))
    return name, (
        f"{lead} (share below {_number(100 * fraction)} % of their tensor's RMS, HORST minus "
        f"AdamW: {_effect(record, 100)} percentage points; {_verdict(payload, name)})"
    )


def _vision_against_ham(payload: Mapping[str, Any]) -> Sentence | None:
    parts, verdicts = [], {}
    near_zero = []
    found = _claim(payload, BEATS_HAM)
    highest = max(payload["config"]["sparsities"])
    top = _shown(highest)
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
        lead = {
            "reproduced": "HORST beat HAM",
            "not reproduced": f"HORST did worse than HAM{setting}, so prefer HAM there",
            "inconclusive": "these seeds cannot tell HORST from HAM",
            "untested": f"HORST against HAM is not known ({_why_untested(record, top)})",
        }[verdict]
        parts.append(
            f"Training the vision transformer with AC/DC, {lead}: at {top} sparsity HORST's "
            f"top-1 accuracy minus HAM's was {_effect(record, 100)} points "
            f"({_verdict(payload, name)})"
        )
    for part, where in ((NEAR_ZERO_VIT, "vision-transformer"), (NEAR_ZERO_LM, "language-model")):
        near = _near_zero_part(payload, part, where)
        if near is not None:
            verdicts[near[0]] = verdict_of(payload, near[0])
            near_zero.append(near[1])
    if near_zero:
        parts.append(" and ".join(near_zero))
    if not parts:
        return None
    horst = vision["selected"].get("horst", {})
    ratio = _mean(vision["move_ratio"].get("horst", {}).get(sparsity_key(highest), []))
    strength = _mean(vision["strength"].get("horst", []))
    edge = _grid_note(payload, "(a)", "horst")
    acted = ""
    if "alpha" in horst and math.isfinite(ratio):
        moved = "acted, moving" if ratio >= acting.MOVE_RATIO_FLOOR else "barely acted, moving only"
        acted = (
            f"; on the vision transformer HORST's mirror step {moved} the weights about "
            f"{_number(ratio)} times as far as its Adam step at its selected alpha "
            f"{horst['alpha']:g} (strength {_number(strength)})" + (f" ({edge})" if edge else "")
        )
    text = "; ".join(parts)
    return Sentence(f"{text[0].upper()}{text[1:]}{acted}.", verdicts)


def _vision_against_adamw(payload: Mapping[str, Any]) -> Sentence | None:
    found = [c for c in (_claim(payload, BEATS_ADAMW), _claim(payload, HALF_THE_LOSS)) if c]
    if not found:
        return None
    sparsities = payload["config"]["sparsities"]
    top = _shown(max(sparsities))
    high = "-".join(f"{round(100 * t)}" for t in sparsities if t >= HIGH_SPARSITY - 1e-9) + " %"
    what = {
        BEATS_ADAMW: f"HORST reaches a higher accuracy than AdamW at {top}",
        HALF_THE_LOSS: f"HORST loses at most half the accuracy AdamW loses at {high}",
    }
    tested = {
        BEATS_ADAMW: {
            "reproduced": f"HORST beat AdamW at {top}",
            "not reproduced": f"HORST did worse than AdamW at {top}, so prefer AdamW there",
            "inconclusive": f"these seeds cannot tell HORST from AdamW at {top}",
        },
        HALF_THE_LOSS: {
            "reproduced": f"HORST lost at most half the accuracy AdamW lost at {high}",
            "not reproduced": f"HORST lost more than half the accuracy AdamW lost at {high}",
            "inconclusive": "these seeds cannot tell whether HORST loses at most half the "
            f"accuracy AdamW loses at {high}",
        },
    }
    effects = {
        BEATS_ADAMW: "HORST's top-1 accuracy minus AdamW's",
        HALF_THE_LOSS: "accuracy HORST lost minus half what AdamW lost",
    }
    verdicts = {name: verdict_of(payload, name) for name, _ in found}
    unknown = [(n, r) for n, r in found if verdicts[n] == "untested"]
    parts = []
    if unknown:
        claims = " and whether ".join(_by_role(payload, what, name) for name, _ in unknown)
        reasons = list(dict.fromkeys(_why_untested(record, top) for _, record in unknown))
        stays = "stay" if len(unknown) > 1 else "stays"
        parts.append(f"whether {claims} {stays} untested: {'; '.join(reasons)}")
    for name, record in found:
        if verdicts[name] != "untested":
            parts.append(
                f"{_by_role(payload, tested, name)[verdicts[name]]} "
                f"({_by_role(payload, effects, name)}: "
                f"{_effect(record, 100)} points; {_verdict(payload, name)})"
            )
    return Sentence(f"Under AC/DC, {'; and '.join(parts)}.", verdicts)


def _by_role(payload: Mapping[str, Any], table: Mapping[str, Any], key: str) -> Any:
    """The entry of ``table`` (by role) for the claim of ``key``."""
    keys = role_keys(payload)
    return next(entry for role, entry in table.items() if keys[role] == key)


def _why_untested(record: Mapping[str, Any], top: str = "the highest sparsity") -> str:
    """The failed or unmeasured checks of a claim, in plain words (``top``: the sparsity the
    room checks read)."""
    reasons = []
    for check in record.get("checks", []):
        if check.get("passed"):
            continue
        name, value = check["name"], stored_number(check.get("value"))
        required = _required_number(check.get("required", ""))
        who = name.split()[0]  # AdamW, HAM or HORST
        if name.startswith(("AdamW loses", "HAM loses")):
            reasons.append(
                f"{who} itself lost only {_number(100 * value)} points of accuracy from unpruned "
                f"to {top} (the test needs at least {_number(100 * required)}), so this model "
                f"leaves HORST no room to beat it"
            )
        elif name.startswith(("HORST mirror move", "HAM mirror move")):
            reasons.append(
                f"{who}'s mirror step moved the weights only {_number(value)} times as far as "
                f"its Adam step (the test needs {_number(required)})"
            )
        elif name.startswith("AC/DC reached"):
            reasons.append(f"AC/DC missed its sparsity targets by up to {_number(value)}")
        elif name == FLOOR_CHECK and math.isfinite(value):
            reasons.append(
                f"a selected language model's unpruned validation perplexity was "
                f"{_number(value, 3)} times the best one's (at most {_number(required)} is "
                "selectable), so its selection fell back to a point nothing chose"
            )
        else:
            reasons.append(f"{name} was {_number(value)}, needing {check.get('required')}")
    return "; ".join(reasons) or "a check was not measured"


def _required_number(required: str) -> float:
    """The number in a check's requirement such as ``">= 0.03"`` (NaN when there is none)."""
    match = re.search(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", str(required))
    return float(match.group()) if match else math.nan
