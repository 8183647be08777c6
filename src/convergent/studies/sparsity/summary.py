"""The ``sparsity`` study's plain summary: what was tested, what a user should do, what stays
unknown, written from a ``results.json`` payload's verdicts and numbers alone.

Five sentences: the scale; the language model's one-shot claim; HORST's strength there (the
selected alpha and the mirror/Adam move ratio it gave); the ViT claims against HAM and on
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
    claims_by_name,
    finite_mean,
    stored_number,
    verdict_of,
)
from convergent.studies.sparsity.claims import HIGH_SPARSITY
from convergent.studies.sparsity.config import sparsity_key

# A stable part of each claim's name (the rest carries the configured sparsities).
BEATS_ADAMW = "higher top-1 accuracy than AdamW"
BEATS_HAM = "higher top-1 accuracy than HAM"
HALF_THE_LOSS = "loses at most half"
NEAR_ZERO = "concentrate near zero"
LANGUAGE = "character LM"
AXIS_NAMES = {"lr": "learning rate", "weight_decay": "weight decay"}


def summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The study's summary sentences from its ``results.json`` payload."""
    sentences = [_scale(payload)]
    for write in (_language, _strength, _vision_against_ham, _vision_against_adamw):
        sentence = write(payload)
        if sentence is not None:
            sentences.append(sentence)
    return sentences


def _claim(payload: Mapping[str, Any], part: str) -> tuple[str, Mapping[str, Any]] | None:
    """The name and record of the claim whose name contains ``part`` (None when absent)."""
    found = [(name, record) for name, record in claims_by_name(payload).items() if part in name]
    return found[0] if len(found) == 1 else None


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
    preview = claims_by_name(payload)[name].get("preview")
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
    sparsities, lm_sparsities = _listed(config["sparsities"]), _listed(config["lm_sparsities"])
    return Sentence(
        f"Tested at small scale: a {config['vit_layers']}-layer vision transformer (width "
        f"{config['vit_d_model']}) trained for {config['vit_steps']} steps on Fashion-MNIST and "
        f"pruned during training with AC/DC to {sparsities} % sparsity, and a "
        f"{config['lm_layers']}-layer character language model (width {config['lm_d_model']}) "
        f"trained for {config['lm_steps']} steps on Jane Austen's novels and pruned once after "
        f"training by weight magnitude to {lm_sparsities} %; each optimizer was tuned on a grid "
        f"of the same size ({grid}) with seed {config['selection_seed']} and then scored on "
        f"{len(seeds)} other seed{'s' if len(seeds) != 1 else ''}."
    )


def _shown(fraction: float) -> str:
    """A sparsity as a sentence writes it: ``0.9 -> "90 %"``."""
    return f"{round(100 * fraction)} %"


def _listed(fractions: Sequence[float]) -> str:
    """Fractions as percentages in words: ``(0.5, 0.7, 0.9) -> "50, 70 and 90"``."""
    shown = [f"{round(100 * t)}" for t in fractions]
    return " and ".join([", ".join(shown[:-1]), shown[-1]]) if len(shown) > 1 else "".join(shown)


def _language(payload: Mapping[str, Any]) -> Sentence | None:
    found = _claim(payload, LANGUAGE)
    if found is None:
        return None
    name, record = found
    verdict = verdict_of(payload, name)
    highest = max(payload["config"]["lm_sparsities"])
    top, key = _shown(highest), sparsity_key(highest)
    perplexity = payload["data"]["language"]["perplexity"]
    means = {m: {k: _mean(v) for k, v in by_key.items()} for m, by_key in perplexity.items()}
    sparse = f"{_number(means['horst'][key], 3)} against {_number(means['adamw'][key], 3)}"
    dense = f"{_number(means['horst']['0%'], 3)} against {_number(means['adamw']['0%'], 3)}"
    lead = {
        "reproduced": "For a model you will prune once after training by weight magnitude, "
        "HORST helped",
        "not reproduced": "For a model you will prune once after training by weight magnitude, "
        "HORST did worse than AdamW",
        "inconclusive": "For a model you will prune once after training by weight magnitude, "
        "these seeds cannot tell HORST from AdamW",
        "untested": "Whether HORST helps a model you will prune once after training is not "
        f"known from this run ({_why_untested(record)})",
    }[verdict]
    return Sentence(
        f"{lead}: at {top} sparsity the HORST-trained language model's test perplexity was "
        f"{_effect(record)} times AdamW's ({_verdict(payload, name)}; {sparse}, while unpruned "
        f"it was {dense}).",
        {name: verdict},
    )


def _strength(payload: Mapping[str, Any]) -> Sentence | None:
    found = _claim(payload, LANGUAGE)
    language = payload["data"]["language"]
    if found is None or "horst" not in language["selected"]:
        return None
    name, _ = found
    verdict = verdict_of(payload, name)
    selected = language["selected"]["horst"]
    ratio = _number(_mean(language["move_ratio"]["horst"]))
    edge = _grid_note(payload, "(b)", "horst")
    where = f"alpha {selected['alpha']:g} with learning rate {selected['lr']:g} here" + (
        f"; {edge}" if edge else ""
    )
    lead = {
        "reproduced": "Use it at a strength where its mirror step moves the weights about "
        f"{ratio} times as far as its Adam step ({where})",
        "not reproduced": "Keep AdamW for one-shot pruning: HORST's mirror step acted, moving "
        f"the weights about {ratio} times as far as its Adam step ({where}), and did not pay",
        "inconclusive": "Before choosing HORST for this, run more seeds or a larger test set; "
        f"its mirror step moved the weights about {ratio} times as far as its Adam step "
        f"({where})",
        "untested": "A fair test needs a larger alpha: the mirror step moved the weights only "
        f"about {ratio} times as far as the Adam step ({where})",
    }[verdict]
    return Sentence(
        f"{lead}; that ratio grows roughly with alpha times the typical weight size, so on "
        "another model set alpha by the ratio convergent.optim.horst_move_ratio reports rather "
        f"than by copying {selected['alpha']:g}.",
        {name: verdict},
    )


def _vision_against_ham(payload: Mapping[str, Any]) -> Sentence | None:
    parts, verdicts = [], {}
    found = _claim(payload, BEATS_HAM)
    highest = max(payload["config"]["sparsities"])
    top = _shown(highest)
    if found is not None:
        name, record = found
        verdict = verdicts[name] = verdict_of(payload, name)
        ham = payload["data"]["vision"]["selected"].get("ham", {})
        setting = (
            f" (alpha {ham['alpha']:g} with learning rate {ham['lr']:g} selected)"
            if {"alpha", "lr"} <= set(ham)
            else ""
        )
        lead = {
            "reproduced": "HORST beat HAM",
            "not reproduced": f"HORST did worse than HAM{setting}, so prefer HAM there",
            "inconclusive": "these seeds cannot tell HORST from HAM",
            "untested": f"HORST against HAM is not known ({_why_untested(record)})",
        }[verdict]
        parts.append(
            f"{lead}: at {top} sparsity HORST's top-1 accuracy minus HAM's was "
            f"{_effect(record, 100)} points ({_verdict(payload, name)})"
        )
    found = _claim(payload, NEAR_ZERO)
    if found is not None:
        name, record = found
        verdict = verdicts[name] = verdict_of(payload, name)
        lead = {
            "reproduced": "HORST's unpruned weights were more concentrated near zero than AdamW's",
            "not reproduced": "HORST's unpruned weights were less concentrated near zero than "
            "AdamW's",
            "inconclusive": "these seeds cannot tell whether HORST's unpruned weights sit "
            "nearer zero than AdamW's",
            "untested": "whether HORST's weights sit nearer zero is not known "
            f"({_why_untested(record)})",
        }[verdict]
        fraction = stored_number(payload["data"].get("rms_fraction"))
        parts.append(
            f"{lead} (share below {_number(100 * fraction)} % of their tensor's RMS, HORST "
            f"minus AdamW: {_effect(record, 100)} percentage points; {_verdict(payload, name)})"
        )
    if not parts:
        return None
    vision = payload["data"]["vision"]
    horst = vision["selected"].get("horst", {})
    ratio = _mean(vision["move_ratio"]["horst"].get(sparsity_key(highest), []))
    edge = _grid_note(payload, "(a)", "horst")
    acted = ""
    if "alpha" in horst and math.isfinite(ratio):
        moved = "acted, moving" if ratio >= acting.MOVE_RATIO_FLOOR else "barely acted, moving only"
        acted = (
            f"; HORST's mirror step {moved} the weights about {_number(ratio)} times as far as "
            f"its Adam step at its selected alpha {horst['alpha']:g}"
            + (f" ({edge})" if edge else "")
        )
    return Sentence(
        f"Training the vision transformer with AC/DC, {parts[0]}"
        + "".join(f", and {part}" for part in parts[1:])
        + f"{acted}.",
        verdicts,
    )


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
        claims = " and whether ".join(_by_part(what, name) for name, _ in unknown)
        reasons = list(dict.fromkeys(_why_untested(record, top) for _, record in unknown))
        stays = "stay" if len(unknown) > 1 else "stays"
        parts.append(f"whether {claims} {stays} untested: {'; '.join(reasons)}")
    for name, record in found:
        if verdicts[name] != "untested":
            parts.append(
                f"{_by_part(tested, name)[verdicts[name]]} ({_by_part(effects, name)}: "
                f"{_effect(record, 100)} points; {_verdict(payload, name)})"
            )
    return Sentence(f"Under AC/DC, {'; and '.join(parts)}.", verdicts)


def _by_part(table: Mapping[str, Any], name: str) -> Any:
    """The entry of ``table`` whose key is part of the claim's ``name``."""
    return next(entry for part, entry in table.items() if part in name)


def _why_untested(record: Mapping[str, Any], top: str = "the highest sparsity") -> str:
    """The failed or unmeasured checks of a claim, in plain words (``top``: the sparsity the
    room check reads)."""
    reasons = []
    for check in record.get("checks", []):
        if check.get("passed"):
            continue
        name, value = check["name"], stored_number(check.get("value"))
        required = _required_number(check.get("required", ""))
        if name.startswith("AdamW loses"):
            reasons.append(
                f"AdamW itself lost only {_number(100 * value)} points of accuracy from unpruned "
                f"to {top} (the test needs at least {_number(100 * required)}), so this model "
                "leaves no optimizer room to help"
            )
        elif name.startswith("HORST mirror move"):
            reasons.append(
                f"HORST's mirror step moved the weights only {_number(value)} times as far as "
                f"its Adam step (the test needs {_number(required)})"
            )
        elif name.startswith("AC/DC reached"):
            reasons.append(f"AC/DC missed its sparsity targets by up to {_number(value)}")
        else:
            reasons.append(f"{name} was {_number(value)}, needing {check.get('required')}")
    return "; ".join(reasons) or "a check was not measured"


def _required_number(required: str) -> float:
    """The number in a check's requirement such as ``">= 0.03"`` (NaN when there is none)."""
    match = re.search(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", str(required))
    return float(match.group()) if match else math.nan
