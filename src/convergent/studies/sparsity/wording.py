"""The words the ``sparsity`` study's summary and brief share: which claim plays which role in
a sentence (`role_keys`), numbers rounded as a sentence writes them, and why a claim's
manipulation checks left it untested, all read from a ``results.json`` payload."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from convergent.studies.framework import claims_by_key, finite_mean, stored_number, verdict_of
from convergent.studies.sparsity.checks import FLOOR_CHECK
from convergent.studies.sparsity.claims import (
    HIGH_SPARSITY,
    half_loss_key,
    near_zero_key,
    pruned_key,
    vision_key,
)
from convergent.studies.sparsity.config import sparsity_key


class Role(StrEnum):
    """The role of each claim a sentence reads (`role_keys` gives its key for a payload's
    config)."""

    BEATS_ADAMW = "beats AdamW"
    BEATS_HAM = "beats HAM"
    HALF_THE_LOSS = "half the loss"
    NEAR_ZERO_VIT = "near zero, ViT"
    NEAR_ZERO_LM = "near zero, LM"


def role_keys(payload: Mapping[str, Any]) -> dict[Role, str]:
    """The key of each role's claim under the payload's config (the claims' own key builders,
    given the sparsities the claims read)."""
    config = payload["config"]
    top = sparsity_key(max(config["sparsities"]))
    high = [sparsity_key(t) for t in config["sparsities"] if t >= HIGH_SPARSITY - 1e-9]
    return {
        Role.BEATS_ADAMW: vision_key("adamw", top),
        Role.BEATS_HAM: vision_key("ham", top),
        Role.HALF_THE_LOSS: half_loss_key(high),
        Role.NEAR_ZERO_VIT: near_zero_key("ViT"),
        Role.NEAR_ZERO_LM: near_zero_key("character LM"),
    }


def role_claim(payload: Mapping[str, Any], role: Role) -> tuple[str, Mapping[str, Any]] | None:
    """The key and record of ``role``'s claim (None when the results hold none)."""
    key = role_keys(payload)[role]
    record = claims_by_key(payload).get(key)
    return None if record is None else (key, record)


def one_shot_claims(payload: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The one-shot claims (claim 5), one per pruner and target, in the payload's order."""
    config = payload["config"]
    keys = {
        pruned_key(pruner, sparsity_key(target))
        for pruner in config["lm_pruners"]
        for target in config["lm_sparsities"]
    }
    return [(key, record) for key, record in claims_by_key(payload).items() if key in keys]


def rounded(value: Any, digits: int = 2) -> str:
    """``value`` to ``digits`` significant digits (at least to the units), "n/a" if missing."""
    value = stored_number(value)
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{round(value, decimals):g}"


def effect_with_interval(record: Mapping[str, Any], scale: float = 1.0) -> str:
    """The claim's effect and 95 % interval, e.g. ``-2.3 [-3.6, -0.94]`` (times ``scale``)."""
    effect = stored_number(record["effect"]) * scale
    interval = record.get("interval")
    if not interval:
        return rounded(effect)
    low, high = (stored_number(v) * scale for v in interval)
    return f"{rounded(effect)} [{rounded(low)}, {rounded(high)}]"


def verdict_phrase(payload: Mapping[str, Any], name: str) -> str:
    """The verdict as written in a sentence: ``reproduced``, or ``reproduced, a preview``."""
    preview = claims_by_key(payload)[name].get("preview")
    return verdict_of(payload, name) + (", a preview" if preview else "")


def stored_mean(values: Sequence[Any]) -> float:
    return finite_mean([stored_number(v) for v in values])


def percent_shown(fraction: float) -> str:
    """A sparsity as a sentence writes it: ``0.9 -> "90 %"``."""
    return f"{round(100 * fraction)} %"


def key_shown(key: str) -> str:
    """A data key as a sentence writes it: ``"90%" -> "90 %"``."""
    return key.replace("%", " %")


def by_role(payload: Mapping[str, Any], table: Mapping[Role, Any], key: str) -> Any:
    """The entry of ``table`` (by role) for the claim of ``key``."""
    keys = role_keys(payload)
    return next(entry for role, entry in table.items() if keys[role] == key)


def why_untested(record: Mapping[str, Any], top: str = "the highest sparsity") -> str:
    """The failed or unmeasured checks of a claim, in plain words (``top``: the sparsity the
    room checks read)."""
    reasons = []
    for check in record.get("checks", []):
        if check.get("passed"):
            continue
        name, value = check["name"], stored_number(check.get("value"))
        required = required_number(check.get("required", ""))
        who = name.split()[0]  # AdamW, HAM or HORST
        if name.startswith(("AdamW loses", "HAM loses")):
            reasons.append(
                f"{who} itself lost only {rounded(100 * value)} points of accuracy from unpruned "
                f"to {top} (the test needs at least {rounded(100 * required)}), so this model "
                f"leaves HORST no room to beat it"
            )
        elif name.startswith(("HORST mirror move", "HAM mirror move")):
            reasons.append(
                f"{who}'s mirror step moved the weights only {rounded(value)} times as far as "
                f"its Adam step (the test needs {rounded(required)})"
            )
        elif name.startswith("AC/DC reached"):
            reasons.append(f"AC/DC missed its sparsity targets by up to {rounded(value)}")
        elif name == FLOOR_CHECK and math.isfinite(value):
            reasons.append(
                f"a selected language model's unpruned validation perplexity was "
                f"{rounded(value, 3)} times the best one's (at most {rounded(required)} is "
                "selectable), so its selection fell back to a point nothing chose"
            )
        else:
            reasons.append(f"{name} was {rounded(value)}, needing {check.get('required')}")
    return "; ".join(reasons) or "a check was not measured"


def required_number(required: str) -> float:
    """The number in a check's requirement such as ``">= 0.03"`` (NaN when there is none)."""
    match = re.search(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", str(required))
    return float(match.group()) if match else math.nan
