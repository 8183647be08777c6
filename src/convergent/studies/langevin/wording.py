"""The words of the ``langevin`` study's summary and brief: each claim's kind, what its verdict
means in plain words, why a claim was left untested, and numbers written for a reader."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.studies.framework import stored_number as number
from convergent.studies.langevin.checks import (
    FIT_CHECK,
    NORM_CHECK,
    OUTCOME_CHECK,
    OVERFIT_CHECK,
    REGULARIZER_CHECK,
)
from convergent.studies.langevin.claims import (
    ACCURACY,
    BOUNDED,
    GAP_BOUNDED,
    GAP_CREEPS,
    GROWS,
    TARGETS,
    claim_key,
)

LABELS = {"attention": "attention", "lora": "LoRA"}
MEANINGS = {
    "hot": "2/N",
    "warm": "the geometric mean of hot and calibrated",
    "calibrated": "the Bayesian posterior of the averaged squared error",
}
# Each claim kind of `claims` (the middle of its key) as this module's words name it.
KINDS = {
    BOUNDED: "bounded",
    GROWS: "grows",
    GAP_BOUNDED: "gap bounded",
    GAP_CREEPS: "gap creeps",
    ACCURACY: "accuracy",
}
# The kinds tested at each claim temperature, as the untested sentence names them.
KIND_WORDS = {
    "accuracy": "accuracy",
    "gap bounded": "the gap with a penalty",
    "gap creeps": "the gap without one",
}
TEMPERATURE_KINDS = tuple(KIND_WORDS)
# Per kind, what the data showed where the claim held and where it failed, in words that name
# no verdict; an inconclusive or untested claim is "open" or "unchecked" (`WHETHER`).
PHRASES = {
    "bounded": (
        "the joint norm of the trained matrices stayed at most {tol} above the radius the "
        "penalty sets",
        "the joint norm rose more than {tol} above the radius the penalty sets",
    ),
    "grows": ("without one it grew", "without one it did not grow by {growth}"),
    "accuracy": (
        "a penalty changed the test RMSE by at most {margin} either way",
        "a penalty changed the test RMSE by more than {margin}",
    ),
    "gap bounded": (
        "with a penalty the generalization gap did not creep up",
        "with a penalty the generalization gap crept up",
    ),
    "gap creeps": (
        "without a penalty the gap crept up",
        "without a penalty the gap did not creep up",
    ),
}
# An untested claim was measured, but a check showed its test could not decide it.
WHETHER = {"inconclusive": "it is open whether", "untested": "it is untested whether"}
# Why a claim was left untested, per failed check: words, and whether its worst value is the
# largest (else the smallest) over the claims.
REASONS = (
    (FIT_CHECK, "phase 2 lost the pre-trained fit (training RMSE {worst} times its phase-1 "
     "value, {need} allowed)", True),
    (OUTCOME_CHECK, "the noise moved the final test RMSE by {worst} of its phase-1 value against "
     "the same run without noise ({need} needed), so the runs ended where plain gradient "
     "descent did", False),
    (NORM_CHECK, "the noise moved the norm by {worst} against the same run without noise "
     "({need} needed)", False),
    (REGULARIZER_CHECK, "the penalty barely moved the norm (end norm {worst} times the "
     "unregularized run's, {need} needed)", True),
    (OVERFIT_CHECK, "the regime could not overfit ({worst}, {need} needed)", False),
)  # fmt: skip
PERCENT_CHECKS = (OUTCOME_CHECK, NORM_CHECK)


@dataclass(frozen=True)
class StudyClaim:
    """One claim record with its key, experiment, kind (one of `KINDS`' words) and temperature."""

    key: str
    experiment: str
    kind: str
    temperature: str
    record: Mapping[str, Any]

    @property
    def verdict(self) -> str:
        return str(self.record["verdict"])


def study_claims(payload: Mapping[str, Any]) -> list[StudyClaim]:
    """The payload's claims, in its order, each with the experiment, kind and temperature its
    key gives (claims 1 and 2: the bound temperature); a KeyError names a key none gives."""
    config = payload["config"]
    bound = str(config["bound_temperature"])
    meaning = {
        claim_key(experiment, kind, temperature): (experiment, words, temperature or bound)
        for experiment in TARGETS
        for kind, words in KINDS.items()
        for temperature in ["", *map(str, config["claim_temperatures"])]
    }
    found = []
    for record in payload["claims"]:
        key = str(record["key"])
        if key not in meaning:
            raise KeyError(f"{key!r} is no langevin claim key of this config")
        found.append(StudyClaim(key, *meaning[key], record))
    return found


def significant(value: float, digits: int = 2) -> str:
    """``value`` to ``digits`` significant digits, plainly written (``1.5e-4`` when tiny)."""
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if digits - 1 <= magnitude < 4:  # whole numbers: 1680 -> 1700
        return f"{round(value, digits - 1 - magnitude):.0f}"
    if -3 <= magnitude < 4:
        text = f"{value:.{digits - 1 - magnitude}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa}e{int(exponent)}"


def percent(value: float) -> str:
    return f"{significant(100 * value)} %"


def span(values: Sequence[float], unit: str = "") -> str:
    """ "low to high unit", or one value where both round alike; integers as they are."""
    low, high = (v if isinstance(v, int) else significant(v) for v in (min(values), max(values)))
    return f"{low}{unit}" if low == high else f"{low} to {high}{unit}"


def shown(
    claim: StudyClaim, unit: str = " %", scale: Callable[[float], float] = lambda v: 100 * v
) -> str:
    """The claim's effect, scaled, in ``unit``, and its 95 % interval ("3.1 % [1.8, 4.4]")."""
    text = significant(scale(number(claim.record["effect"]))) + unit
    if claim.record.get("interval") is not None:
        low, high = (significant(scale(number(end))) for end in claim.record["interval"])
        text += f" [{low}, {high}]"
    return text


def _failed(claim: StudyClaim) -> list[Mapping[str, Any]]:
    return [check for check in claim.record["checks"] if check["passed"] is not True]


def _failed_text(check: Mapping[str, Any]) -> str:
    """A failed check's short name with its value and requirement ("run steps / radial
    relaxation steps 4.97, >= 5 needed"), or "not measured"."""
    name = str(check["name"]).partition(" (")[0]
    value = check.get("value")
    if value is None or not math.isfinite(number(value)):
        return f"{name} not measured"
    required = str(check["required"])
    shown = significant(number(value), 3)
    if shown == required.partition(" ")[2]:  # 4.9996 would read "5, >= 5 needed"
        shown = f"{number(value):.6g}"
    return f"{name} {shown}, {required} needed"


def clauses(
    claims: Sequence[StudyClaim],
    config: Mapping[str, Any],
    unit: str = " %",
    scale: Callable[[float], float] = lambda v: 100 * v,
    by_temperature: bool = False,
    after: str = "",
) -> list[str]:
    """Per verdict among ``claims`` (all of one kind): what it means, then "(verdict: label
    effect [interval], ...after)"; an untested claim names its failed checks instead."""
    values = {
        "tol": percent(number(config["bound_tolerance"])),
        "growth": percent(number(config["growth_threshold"])),
        "margin": percent(number(config["accuracy_margin"])),
    }
    found = []
    for verdict in ("reproduced", "not reproduced", "inconclusive", "untested"):
        group = [c for c in claims if c.verdict == verdict]
        if not group:
            continue
        held, failed = (p.format(**values) for p in PHRASES[group[0].kind])
        phrase = {"reproduced": held, "not reproduced": failed}.get(verdict)
        each = []
        for claim in group:
            label = LABELS.get(claim.experiment, claim.experiment)
            label += f" at {claim.temperature}" * by_temperature
            if verdict == "untested":
                names = dict.fromkeys(_failed_text(check) for check in _failed(claim))
                each.append(f"{label}, failed check: {'; '.join(names)}")
            else:
                each.append(f"{label} {shown(claim, unit, scale)}")
        tail = after * (verdict != "untested")
        found.append(
            f"{phrase or WHETHER[verdict] + ' ' + held} ({verdict}: {', '.join(each)}{tail})"
        )
    return found


def declared(claims: Sequence[StudyClaim]) -> dict[str, str]:
    return {claim.key: claim.verdict for claim in claims}


def of_kind(claims: Sequence[StudyClaim], *kinds: str) -> list[StudyClaim]:
    """The claims of ``kinds`` (words of `KINDS`), in their order."""
    return [claim for claim in claims if claim.kind in kinds]


def all_reproduced(claims: Sequence[StudyClaim]) -> bool:
    """Whether there are claims and every one is reproduced."""
    return bool(claims) and all(claim.verdict == "reproduced" for claim in claims)


def reason(untested: Sequence[StudyClaim], moved: Mapping[str, Sequence[float]]) -> str:
    """Why ``untested`` were left untested, from their failed checks, naming the experiments
    where a check failed for only some of them (``moved``: per experiment, how far the noise
    moved each variant's test RMSE at their temperature, as `summary.TemperatureFit` has it)."""
    reasons = []
    everyone = {c.experiment for c in untested}
    for prefix, words, largest in REASONS:
        failed = [(c, k) for c in untested for k in _failed(c) if str(k["name"]).startswith(prefix)]
        if not failed:
            continue
        values = [number(k["value"]) for _, k in failed]
        worst = max(values) if largest else min(values)
        form, _, bound = str(failed[0][1]["required"]).partition(" ")
        need = {">=": "at least", "<=": "at most"}.get(form, form)
        who = {c.experiment for c, _ in failed}
        if prefix in PERCENT_CHECKS:
            needed = f"{need} {percent(float(bound))}"
            # For the outcome: the largest move over the failing experiments' variants, when
            # it too falls short; else some variant moved enough and another did not.
            most_moved = max((m for e in who for m in moved.get(e, ())), default=worst)
            if prefix == OUTCOME_CHECK and most_moved >= float(bound):
                text = (
                    f"the noise moved some variant's final test RMSE by only {percent(worst)} of "
                    f"its phase-1 value against the same run without noise ({needed} needed)"
                )
            else:
                shown = most_moved if prefix == OUTCOME_CHECK else worst
                text = words.format(worst=f"at most {percent(shown)}", need=needed)
        else:
            text = words.format(worst=significant(worst), need=f"{need} {bound}")
        if who != everyone:
            text = f"for {' and '.join(LABELS.get(e, e) for e in sorted(who))} {text}"
        reasons.append(text)
    known = tuple(prefix for prefix, _, _ in REASONS)
    others = {
        str(k["name"]).partition(" (")[0]
        for c in untested
        for k in _failed(c)
        if not str(k["name"]).startswith(known)
    }
    return ", and ".join(reasons + [f"a check failed ({name})" for name in sorted(others)])
