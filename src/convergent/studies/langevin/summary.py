"""The ``langevin`` study's plain summary: what a user should take from its verdicts.

`summary(payload)` reads a ``results.json`` payload: the claims (verdict, effect, interval,
checks), the penalty strengths the runs used (lam, and the radius factor selected on
validation in ``data["selection"]``) and, per claim temperature, whether Langevin's noise acted
there (`temperature_fits`): whether phase 2 kept the pre-trained fit, and whether the noise
moved the final test RMSE against the same seed's noiseless (s = 0) run. Each verdict a
sentence states is worded by the verdict the payload holds and declared, so a rescored or
re-run result rewrites its own summary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convergent.studies.framework import Sentence, claims_by_name
from convergent.studies.framework import stored_number as number
from convergent.studies.langevin.claims import experiments
from convergent.studies.langevin.measures import (
    FIT_CHECK,
    NOISE_CHECK,
    OUTCOME_CHECK,
    OVERFIT_CHECK,
    REGULARIZER_CHECK,
    final,
    growth,
    mean,
)

LABELS = {"attention": "attention", "lora": "LoRA"}
MEANINGS = {
    "hot": "2/N",
    "warm": "the geometric mean of hot and calibrated",
    "calibrated": "the Bayesian posterior of the averaged squared error",
}
# A claim's kind from its statement; the first match wins ("stay bounded" before "norms of").
KINDS = (
    ("stay bounded", "bounded"),
    ("norms of", "grows"),
    ("does not creep up", "gap bounded"),
    ("creeps up", "gap creeps"),
    ("accuracy", "accuracy"),
)
TEMPERATURE_KINDS = ("accuracy", "gap bounded", "gap creeps")  # tested at each temperature
KIND_WORDS = {"accuracy": "accuracy", "gap bounded": "the gap with a penalty"}
KIND_WORDS["gap creeps"] = "the gap without one"
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
        "a penalty cost at most {margin} in test RMSE",
        "a penalty cost more than {margin} in test RMSE",
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
WHETHER = {"inconclusive": "it is open whether", "untested": "it was not checked whether"}
# Why a claim was left untested, per failed check: words, and whether its worst value is the
# largest (else the smallest) over the claims.
REASONS = (
    (OUTCOME_CHECK, "the noise moved the final test RMSE by {worst} of its phase-1 value against "
     "the same run without noise ({need} needed), so the runs ended where plain gradient "
     "descent did", False),
    (REGULARIZER_CHECK, "the penalty barely moved the norm (end norm {worst} times the "
     "unregularized run's, {need} needed)", True),
    (FIT_CHECK, "phase 2 lost the pre-trained fit (training RMSE {worst} times its phase-1 "
     "value, {need} allowed)", True),
    (NOISE_CHECK, "the noise was weak against the gradient ({worst}, {need} needed)", False),
    (OVERFIT_CHECK, "the regime could not overfit ({worst}, {need} needed)", False),
)  # fmt: skip


@dataclass(frozen=True)
class StudyClaim:
    """One claim record, with its name (`claim_names`: what a Sentence declares), experiment
    (``attention`` or ``lora``), kind (one of `KINDS`) and the temperature its statement names."""

    name: str
    experiment: str
    kind: str
    temperature: str
    record: Mapping[str, Any]

    @property
    def verdict(self) -> str:
        return str(self.record["verdict"])


def study_claims(payload: Mapping[str, Any]) -> list[StudyClaim]:
    """The payload's claims, each with its experiment, kind and temperature."""
    found = []
    for name, record in claims_by_name(payload).items():
        statement = str(record["statement"])
        kind = next(kind for words, kind in KINDS if words in statement)
        temperature = re.search(r"at the (\w+) temperature", statement)
        experiment = statement.partition(":")[0]
        found.append(
            StudyClaim(name, experiment, kind, temperature[1] if temperature else "", record)
        )
    return found


@dataclass
class TemperatureFit:
    """At one temperature, per (experiment, variant), means over seeds of: ``train``, the final
    train RMSE / phase-1 train RMSE; ``test``, the same of the test RMSE; ``change``, (final
    test RMSE - the s = 0 run's) / phase-1 test RMSE, and ``moved``, its absolute value (both
    empty without an s = 0 run); per experiment, the unregularized run's total norm end / start
    - 1 (``growth``) after ``steps`` steps."""

    train: list[float] = field(default_factory=list)
    test: list[float] = field(default_factory=list)
    change: list[float] = field(default_factory=list)
    moved: list[float] = field(default_factory=list)
    growth: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)

    def state(self, fit_kept: float, outcome_moved: float) -> str:
        """``lost`` (every variant lost its fit), ``unmoved`` (the noise moved no variant's
        outcome), ``acts`` (every variant kept its fit and moved) or ``mixed``."""
        if min(self.train) > fit_kept:
            return "lost"
        if self.moved and max(self.moved) < outcome_moved:
            return "unmoved"
        if self.moved and min(self.moved) >= outcome_moved and max(self.train) <= fit_kept:
            return "acts"
        return "mixed"


def temperature_fits(payload: Mapping[str, Any]) -> dict[str, TemperatureFit]:
    """`TemperatureFit` per claim temperature that ran."""
    config, data = payload["config"], payload["data"]
    fits = {}
    for temperature in map(str, config["claim_temperatures"]):
        fit = TemperatureFit()
        for experiment in experiments(config, data):
            phase1 = [run["pretrained"] for run in experiment.runs]
            for variant in [v for v in experiment.variants if experiment.has(temperature, v)]:
                records = experiment.records(temperature, variant)
                if variant == "none":
                    fit.growth.append(mean([growth(r) for r in records]))
                    fit.steps.append(mean([number(r["steps"]) for r in records]))
                runs = list(zip(records, phase1, strict=True))
                for key, into in (("train_rmse", fit.train), ("test_rmse", fit.test)):
                    into.append(mean([final(r, key) / number(p[key]) for r, p in runs]))
                if experiment.has("zero", variant):
                    zero = [final(z, "test_rmse") for z in experiment.records("zero", variant)]
                    change = [
                        (final(r, "test_rmse") - z) / number(p["test_rmse"])
                        for (r, p), z in zip(runs, zero, strict=True)
                    ]
                    fit.change.append(mean(change))
                    fit.moved.append(mean([abs(c) for c in change]))
        if fit.train:
            fits[temperature] = fit
    return fits


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
        return _trimmed(f"{value:.{digits - 1 - magnitude}f}")
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{_trimmed(mantissa)}e{int(exponent)}"


def _trimmed(text: str) -> str:
    """``text`` without trailing zeros after a decimal point ("0.020" -> "0.02")."""
    return text.rstrip("0").rstrip(".") if "." in text else text


def percent(value: float) -> str:
    return f"{significant(100 * value)} %"


def _span(values: Sequence[float], unit: str = "") -> str:
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
                names = dict.fromkeys(str(c["name"]).partition(" (")[0] for c in _failed(claim))
                each.append(f"{label}, failed check: {'; '.join(names)}")
            else:
                each.append(f"{label} {shown(claim, unit, scale)}")
        tail = after * (verdict != "untested")
        found.append(
            f"{phrase or WHETHER[verdict] + ' ' + held} ({verdict}: {', '.join(each)}{tail})"
        )
    return found


def _declared(claims: Sequence[StudyClaim]) -> dict[str, str]:
    return {claim.name: claim.verdict for claim in claims}


def _s(payload: Mapping[str, Any], temperature: str) -> str:
    return significant(number(payload["data"]["temperatures"][temperature]))


def scale_sentence(payload: Mapping[str, Any], claims: Sequence[StudyClaim]) -> Sentence:
    """What was tested, on which model and data, with how many seeds, at which temperatures."""
    config, data = payload["config"], payload["data"]
    regime = data.get("regime") or {}
    steps = [
        round(number(record["steps"]))
        for runs in data["runs"].values()
        for run in runs
        for variants in run["phase2"].values()
        for record in variants.values()
    ]
    temperatures = [
        f"{_s(payload, t)} ({t}{', ' + MEANINGS[t] if t in MEANINGS else ''})"
        for t in config["claim_temperatures"]
    ]
    listed = ", ".join(temperatures[:-1]) + (" and " if len(temperatures) > 1 else "")
    seeds = len(config["seeds"])
    preview = " (every verdict a preview)" if any(c.record["preview"] for c in claims) else ""
    return Sentence(
        f"Tested on generated Darcy flow with {seeds} seed{'s' * (seeds != 1)}{preview}: a "
        f"small vision-transformer regressor (width {regime.get('d_model', '?')}) pre-trained "
        f"on {regime.get('train_fields', '?')} fields, then only its attention W_Q and W_K, or "
        f"rank-{config.get('lora_rank', '?')} LoRA factors in a "
        f"{config.get('lora_layers', '?')}-layer model, trained by Langevin steps (step size "
        f"{significant(number(config['langevin_lr']))}, {_span(steps)} steps) with no penalty, "
        f"the log-amplified one or the super-quadratic one, at s = {listed}{temperatures[-1]}, "
        "where s/2 is the temperature in units of the averaged squared error; test RMSE on "
        f"{config.get('test_fields', '?')} new fields."
    )


def strengths(payload: Mapping[str, Any], temperature: str) -> str:
    """lam per experiment and penalty (mean over seeds) and the radius factors selected."""
    selection = payload["data"].get("selection", {})
    lams: list[str] = []
    factors: list[str] = []
    for experiment in experiments(payload["config"], payload["data"]):
        penalties = experiment.penalties(temperature)
        label = LABELS.get(experiment.name, experiment.name)
        # The penalties' names once, with the first experiment's values.
        named = [
            significant(mean([number(r["lam"]) for r in experiment.records(temperature, p)]))
            + ("" if lams else f" ({p})")
            for p in penalties
        ]
        lams += [f"{' and '.join(named)} for {label}"] * bool(named)
        chosen = []
        for record in filter(None, (selection.get(experiment.name, {}).get(p) for p in penalties)):
            grid = [number(point["radius_factor"]) for point in record["grid"]]
            factor = number(record["selected"])
            chosen.append(f"{factor:g}" + " (the grid's edge)" * (factor in (min(grid), max(grid))))
        factors += [f"{' and '.join(chosen)} for {label}"] * bool(chosen)
    text = f"lam of about {' and '.join(lams)}, in loss units and kept at every temperature"
    if factors:
        tolerance = percent(number(payload["config"]["selection_tolerance"]))
        text += (
            f" (radius factors {', '.join(factors)}: alone, the penalty would hold the norm at "
            f"that multiple of its pre-trained value; each factor the strongest within "
            f"{tolerance} of the best validation RMSE)"
        )
    return text


def norm_sentence(payload: Mapping[str, Any], claims: Sequence[StudyClaim]) -> Sentence | None:
    """What a user does about the norms: the bounded and growth claims, at which lam."""
    bounded = [c for c in claims if c.kind == "bounded"]
    grows = [c for c in claims if c.kind == "grows"]
    if not bounded and not grows:
        return None
    config, temperature = payload["config"], (bounded or grows)[0].temperature
    if bounded and all(c.verdict == "reproduced" for c in bounded):
        lead = "To keep the weights bounded under Langevin noise, add one of the penalties"
    else:
        lead = "Whether a penalty keeps the weights bounded is not settled here"
    growths = clauses(grows, config, "-fold", lambda v: 1 + v)
    diffusion = [
        mean([number(v) for v in c.record.get("extra", {}).get("observed_over_diffusion", [])])
        for c in grows
        if c.verdict == "reproduced"
    ]
    if growths and diffusion and all(math.isfinite(d) for d in diffusion):
        growths[-1] += (
            ", as fast as pure noise diffusion predicts (end norm "
            f"{' and '.join(map(significant, diffusion))} times its prediction)"
        )
    body = "; ".join(clauses(bounded, config))
    body += ", while " * bool(body and growths) + "; ".join(growths)
    return Sentence(
        f"{lead}: at the {temperature} temperature (s = {_s(payload, temperature)}), with "
        f"{strengths(payload, temperature)}, {body}.",
        _declared(bounded + grows),
    )


def lost_sentence(
    payload: Mapping[str, Any],
    claims: Sequence[StudyClaim],
    lost: Sequence[str],
    fits: Mapping[str, TemperatureFit],
) -> Sentence | None:
    """The temperatures where every variant lost its fit, and what their claims are worth."""
    if not lost:
        return None
    at = [c for c in claims if c.kind in TEMPERATURE_KINDS and c.temperature in lost]
    several = len(lost) > 1
    named = " and ".join(f"{t} (s = {_s(payload, t)})" for t in lost) + " temperatures"
    if not several:
        named = f"{lost[0]} temperature (s = {_s(payload, lost[0])})"
    text = (
        f"Do not train at the {named}: every variant lost its pre-trained fit there (final "
        f"training RMSE {_span([v for t in lost for v in fits[t].train])} times its phase-1 "
        f"value, test RMSE {_span([v for t in lost for v in fits[t].test])} times)"
    )
    accuracy = [c for c in at if c.kind == "accuracy"]
    if accuracy:
        found = "; ".join(clauses(accuracy, payload["config"], by_temperature=several))
        text += f", so the finding that {found} compares equally broken models"
    gaps = [c for c in at if c.kind != "accuracy"]
    counts = {v: sum(c.verdict == v for c in gaps) for v in dict.fromkeys(c.verdict for c in gaps)}
    if len(counts) == 1:
        text += f", and the {len(gaps)} generalization-gap claims there are {gaps[0].verdict}"
    elif counts:
        listed = ", ".join(f"{n} {verdict}" for verdict, n in counts.items())
        text += f", and of the {len(gaps)} generalization-gap claims there {listed}"
    return Sentence(text + ".", _declared(at))


def acting_sentence(
    payload: Mapping[str, Any],
    claims: Sequence[StudyClaim],
    acting: Sequence[str],
    other: Sequence[str],
    fits: Mapping[str, TemperatureFit],
) -> Sentence:
    """Where the noise acted while keeping the fit, and the claims decided at the temperatures
    not lost (the untested ones are `unknown_sentence`'s)."""
    s = payload["data"]["temperatures"]
    if acting:
        named = " and ".join(
            f"{t} one, s = {_s(payload, t)} (s/2 = {significant(number(s[t]) / 2)} in loss units)"
            for t in acting
        )
        change = [100 * v for t in acting for v in fits[t].change]
        way = "raised" if min(change) > 0 else "lowered" if max(change) < 0 else "changed"
        change = [abs(v) for v in change] if way != "changed" else change
        lead = (
            f"Of the temperatures tested, Langevin noise acted without wrecking the fit "
            f"{'only ' * (len(acting) < len(fits))}at the {named}: the training RMSE stayed "
            f"within {significant(max(v for t in acting for v in fits[t].train))} times its "
            f"phase-1 value, {'but' if way == 'raised' else 'and'} the noise {way} the final "
            f"test RMSE by {_span(change, ' %')} of its phase-1 value over the same run without "
            "noise"
        )
        grew = [100 * v for t in acting for v in fits[t].growth]
        steps = [round(v) for t in acting for v in fits[t].steps]
        if grew:
            lead += f", and without a penalty the norm grew {_span(grew, ' %')} in {_span(steps)}"
            lead += " steps"
    else:
        lead = (
            "No tested temperature let the noise change the outcome while keeping the fit, so "
            "this study has no temperature to recommend"
        )
    decided = [
        c
        for c in claims
        if c.kind in TEMPERATURE_KINDS and c.temperature in other and c.verdict != "untested"
    ]
    several = any(c.temperature not in acting[:1] for c in decided)
    found = []
    for kind in TEMPERATURE_KINDS:
        after = "" if kind == "accuracy" else " of the phase-1 test RMSE"
        mine = [c for c in decided if c.kind == kind]
        found += clauses(mine, payload["config"], by_temperature=several, after=after)
    text = lead + ("; " + "; ".join(found) if found else "")
    creeps = [c for c in decided if c.kind == "gap creeps"]
    bounded = [c for c in claims if c.kind == "bounded"]
    if (
        creeps
        and bounded
        and all(c.verdict == "not reproduced" for c in creeps)
        and all(c.verdict == "reproduced" for c in bounded)
    ):
        text += ", so what a penalty buys here is bounded weights, not a smaller gap"
        decided += bounded
    return Sentence(text + ".", _declared(decided))


def reason(untested: Sequence[StudyClaim], fit: TemperatureFit) -> str:
    """Why ``untested`` were left untested, from their failed checks, naming the experiments
    where a check failed for only some of them."""
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
        if prefix == OUTCOME_CHECK:  # in percent; the largest move over every variant
            worst = max(fit.moved, default=worst)
            text = words.format(
                worst=f"at most {percent(worst)}", need=f"{need} {percent(float(bound))}"
            )
        else:
            text = words.format(worst=significant(worst), need=f"{need} {bound}")
        who = {c.experiment for c, _ in failed}
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


def unknown_sentence(
    payload: Mapping[str, Any],
    claims: Sequence[StudyClaim],
    other: Sequence[str],
    fits: Mapping[str, TemperatureFit],
) -> Sentence:
    """What stays unknown: the untested claims at the temperatures not lost, and why."""
    parts, declared = [], []
    for temperature in other:
        at = [c for c in claims if c.kind in TEMPERATURE_KINDS and c.temperature == temperature]
        untested = [c for c in at if c.verdict == "untested"]
        if not untested:
            continue
        declared += untested
        why = reason(untested, fits[temperature])
        where = f"{temperature} temperature (s = {_s(payload, temperature)})"
        if len(untested) == len(at):
            parts.append(f"all {len(at)} claims at the {where} are untested, because {why}")
            continue
        kinds: dict[str, list[str]] = {}
        for claim in untested:
            label = LABELS.get(claim.experiment, claim.experiment)
            kinds.setdefault(label, []).append(KIND_WORDS[claim.kind])
        which = " and ".join(f"{label}'s claims on {' and '.join(k)}" for label, k in kinds.items())
        parts.append(f"at the {where}, {which} are untested, because {why}")
    if not parts:
        return Sentence(
            "Every claim outside the temperatures where the fit was lost was decided; what "
            "stays unknown is whether the results carry over to larger models and data."
        )
    return Sentence("What stays unknown: " + "; ".join(parts) + ".", _declared(declared))


def summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The study's plain summary: what was tested, what a user should do (penalty strength,
    temperature), and what stays unknown; every verdict it states is the payload's.

    Args:
        payload: a ``results.json`` object of this study (design 6).

    Returns:
        3 to 5 sentences, each declaring the verdicts it states.
    """
    config = payload["config"]
    claims = study_claims(payload)
    fits = temperature_fits(payload)
    states = {
        temperature: fit.state(number(config["fit_kept"]), number(config["outcome_moved"]))
        for temperature, fit in fits.items()
    }
    lost = [t for t, state in states.items() if state == "lost"]
    acting = [t for t, state in states.items() if state == "acts"]
    other = [t for t in states if t not in lost]
    sentences = [
        scale_sentence(payload, claims),
        norm_sentence(payload, claims),
        lost_sentence(payload, claims, lost, fits),
        acting_sentence(payload, claims, acting, other, fits),
        unknown_sentence(payload, claims, other, fits),
    ]
    return [sentence for sentence in sentences if sentence is not None]
