"""The ``langevin`` study's plain summary, from a ``results.json`` payload: the claims, the
penalty strengths the runs used and, per claim temperature, whether Langevin's noise acted there
(`temperature_fits`). Each verdict a sentence states is the payload's, declared (the words are
in `wording`), so a rescored result rewrites its own summary."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convergent.studies.framework import Sentence, listed
from convergent.studies.framework import stored_number as number
from convergent.studies.langevin.claims import experiments
from convergent.studies.langevin.measures import change_from_zero, final, growth, mean
from convergent.studies.langevin.wording import (
    KIND_WORDS,
    LABELS,
    MEANINGS,
    TEMPERATURE_KINDS,
    StudyClaim,
    all_reproduced,
    clauses,
    declared,
    of_kind,
    percent,
    reason,
    significant,
    span,
    study_claims,
)


@dataclass
class TemperatureFit:
    """At one temperature, per (experiment, variant), means over seeds of: ``train``, final /
    phase-1 train RMSE; ``change``, (final test RMSE - the s = 0 run's) / phase-1 test RMSE at
    the s = 0 run's last step, and ``moved_by``, its absolute value per experiment; per
    experiment, the unregularized norm's end / start - 1 (``growth``) after ``steps`` steps."""

    train: list[float] = field(default_factory=list)
    change: list[float] = field(default_factory=list)
    moved_by: dict[str, list[float]] = field(default_factory=dict)
    growth: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)

    @property
    def moved(self) -> list[float]:
        return [value for values in self.moved_by.values() for value in values]

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
                fit.train.append(
                    mean([final(r, "train_rmse") / number(p["train_rmse"]) for r, p in runs])
                )
                if experiment.has("zero", variant):
                    change = [
                        change_from_zero(r, z) / number(p["test_rmse"])
                        for (r, p), z in zip(runs, experiment.records("zero", variant), strict=True)
                    ]
                    fit.change.append(mean(change))
                    moved = mean([abs(c) for c in change])
                    fit.moved_by.setdefault(experiment.name, []).append(moved)
        if fit.train:
            fits[temperature] = fit
    return fits


def noise_states(payload: Mapping[str, Any], fits: Mapping[str, TemperatureFit]) -> dict[str, str]:
    """Per claim temperature, what the noise did (`TemperatureFit.state`)."""
    config = payload["config"]
    kept, moved = number(config["fit_kept"]), number(config["outcome_moved"])
    return {temperature: fit.state(kept, moved) for temperature, fit in fits.items()}


def lam_means(payload: Mapping[str, Any], temperature: str) -> dict[str, dict[str, float]]:
    """Per experiment that ran a penalty at ``temperature``, lam per penalty (mean over seeds)."""
    found = {}
    for experiment in experiments(payload["config"], payload["data"]):
        lams = {
            p: mean([number(r["lam"]) for r in experiment.records(temperature, p)])
            for p in experiment.penalties(temperature)
        }
        if lams:
            found[experiment.name] = lams
    return found


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
    seeds = len(config["seeds"])
    preview = " (every verdict a preview)" if any(c.record["preview"] for c in claims) else ""
    return Sentence(
        f"Tested on generated Darcy flow with {seeds} seed{'s' * (seeds != 1)}{preview}: a "
        f"small vision-transformer regressor (width {regime.get('d_model', '?')}) pre-trained "
        f"on {regime.get('train_fields', '?')} fields, then only its attention W_Q and W_K, or "
        f"rank-{config.get('lora_rank', '?')} LoRA factors in a "
        f"{config.get('lora_layers', '?')}-layer model, trained by Langevin steps (step size "
        f"{significant(number(config['langevin_lr']))}, {span(steps)} steps) with no penalty, "
        f"the log-amplified one or the super-quadratic one, at s = {listed(temperatures)}, "
        "where s/2 is the temperature in units of the averaged squared error; test RMSE on "
        f"{config.get('test_fields', '?')} new fields."
    )


def _named(payload: Mapping[str, Any], temperatures: Sequence[str]) -> str:
    """ "the warm temperature (s = 1.5e-4)" or "the hot and warm temperatures (s = 0.02 and
    1.5e-4)"."""
    s = " and ".join(_s(payload, t) for t in temperatures)
    plural = "s" * (len(temperatures) > 1)
    return f"the {' and '.join(temperatures)} temperature{plural} (s = {s})"


def temperature_sentence(
    payload: Mapping[str, Any], fits: Mapping[str, TemperatureFit], states: Mapping[str, str]
) -> Sentence:
    """Where the noise acted without wrecking the fit, in the library's units, and what it did
    at the other temperatures (no verdict: the checks' numbers)."""
    data = payload["data"]
    s = {name: number(value) for name, value in data["temperatures"].items()}
    acting = [t for t, state in states.items() if state == "acts"]
    if acting:
        parts = []
        for t in acting:
            part = f"{t} one, s = {_s(payload, t)} (s/2 = {significant(s[t] / 2)} in loss units"
            if s.get("calibrated", 0) > 0 and t != "calibrated":
                times = significant(s[t] / s["calibrated"])
                part += (
                    f"; {times} times the calibrated s = 4 sigma^2 / (N K), as if the noise "
                    f"variance sigma^2 were {times} times the fit's training MSE"
                )
            parts.append(part + ")")
        change = [100 * v for t in acting for v in fits[t].change]
        way = "raised" if min(change) > 0 else "lowered" if max(change) < 0 else "changed"
        change = [abs(v) for v in change] if way != "changed" else change
        text = (
            "Langevin noise changed the outcome without wrecking the fit "
            f"{'only ' * (len(acting) < len(fits))}at the {' and '.join(parts)}: it {way} the "
            f"final test RMSE by {span(change, ' %')} of its phase-1 value against the same "
            "run without noise, the training RMSE staying within "
            f"{significant(max(v for t in acting for v in fits[t].train))} times its phase-1 "
            "value"
        )
        grew = [100 * v for t in acting for v in fits[t].growth]
        if grew:
            steps = [round(v) for t in acting for v in fits[t].steps]
            text += f", and without a penalty the norm grew {span(grew, ' %')} in {span(steps)}"
            text += " steps"
    else:
        text = "No tested temperature let Langevin noise change the outcome while keeping the fit"
    lost = [t for t, state in states.items() if state == "lost"]
    if lost:
        train = [v for t in lost for v in fits[t].train]
        text += (
            f"; at {_named(payload, lost)} every variant lost its pre-trained fit (training "
            f"RMSE {span(train)} times its phase-1 value)"
        )
    unmoved = [t for t, state in states.items() if state == "unmoved"]
    if unmoved:
        moved = max(v for t in unmoved for v in fits[t].moved)
        text += (
            f"; at {_named(payload, unmoved)} the noise moved the final test RMSE by at most "
            f"{percent(moved)} of its phase-1 value, so the runs ended where plain gradient "
            "descent did"
        )
    mixed = [t for t, state in states.items() if state == "mixed"]
    if mixed:
        text += f"; at {_named(payload, mixed)} it acted in some variants only"
    return Sentence(text + ".")


def strengths(payload: Mapping[str, Any], temperature: str) -> str:
    """lam per experiment and penalty (mean over seeds), the radius factors selected and the
    temperature they were selected at."""
    config, data = payload["config"], payload["data"]
    selection = data.get("selection", {})
    lams = [
        # The penalties' names once, with the first experiment's values.
        " and ".join(significant(lam) + f" ({p})" * (not index) for p, lam in means.items())
        + f" for {LABELS.get(name, name)}"
        for index, (name, means) in enumerate(lam_means(payload, temperature).items())
    ]
    factors: list[str] = []
    where: list[str] = []
    for experiment in experiments(config, data):
        penalties = experiment.penalties(temperature)
        label = LABELS.get(experiment.name, experiment.name)
        chosen: list[tuple[str, bool]] = []  # (factor, on the grid's edge)
        for record in filter(None, (selection.get(experiment.name, {}).get(p) for p in penalties)):
            grid = [number(point["radius_factor"]) for point in record["grid"]]
            factor = number(record["selected"])
            chosen.append((f"{factor:g}", factor in (min(grid), max(grid))))
            where.append(str(record.get("temperature") or config.get("selection_temperature")))
        if len(chosen) > 1 and all(edge for _, edge in chosen):
            shown = " and ".join(value for value, _ in chosen) + " (both the grid's edge)"
        else:
            shown = " and ".join(value + " (the grid's edge)" * edge for value, edge in chosen)
        factors += [f"{shown} for {label}"] * bool(chosen)
    text = f"lam of about {' and '.join(lams)}, in loss units and kept at every temperature"
    if factors:
        tolerance = percent(number(config["selection_tolerance"]))
        at = " and ".join(dict.fromkeys(where))
        text += (
            f" (radius factors {', '.join(factors)}: alone, the penalty would hold the norm at "
            f"that multiple of its pre-trained value; each factor the strongest within "
            f"{tolerance} of the best validation RMSE at the {at} temperature"
            + "s" * (" and " in at)
            + ")"
        )
    return text


def norm_sentence(payload: Mapping[str, Any], claims: Sequence[StudyClaim]) -> Sentence | None:
    """What a user does about the norms: the bounded and growth claims, at which lam."""
    bounded, grows = of_kind(claims, "bounded"), of_kind(claims, "grows")
    if not bounded and not grows:
        return None
    config, temperature = payload["config"], (bounded or grows)[0].temperature
    if all_reproduced(bounded):
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
        declared(bounded + grows),
    )


def decided_sentence(payload: Mapping[str, Any], claims: Sequence[StudyClaim]) -> Sentence | None:
    """The gap and accuracy claims that were decided (the untested ones are
    `unknown_sentence`'s)."""
    decided = [c for c in of_kind(claims, *TEMPERATURE_KINDS) if c.verdict != "untested"]
    if not decided:
        return None
    temperatures = list(dict.fromkeys(c.temperature for c in decided))
    several = len(temperatures) > 1
    found = []
    for kind in TEMPERATURE_KINDS:
        after = "" if kind == "accuracy" else " of the phase-1 test RMSE"
        mine = [c for c in decided if c.kind == kind]
        found += clauses(mine, payload["config"], by_temperature=several, after=after)
    text = f"At {_named(payload, temperatures)}, " + "; ".join(found)
    creeps, bounded = of_kind(decided, "gap creeps"), of_kind(claims, "bounded")
    if creeps and all(c.verdict == "not reproduced" for c in creeps) and all_reproduced(bounded):
        text += ", so what a penalty buys here is bounded weights, not a smaller gap"
        decided += bounded
    return Sentence(text + ".", declared(decided))


def unknown_sentence(
    payload: Mapping[str, Any], claims: Sequence[StudyClaim], fits: Mapping[str, TemperatureFit]
) -> Sentence:
    """What stays unknown: the untested claims at each temperature, and why."""
    parts, stated = [], []
    for temperature, fit in fits.items():
        at = [c for c in of_kind(claims, *TEMPERATURE_KINDS) if c.temperature == temperature]
        untested = [c for c in at if c.verdict == "untested"]
        if not untested:
            continue
        stated += untested
        why = reason(untested, fit.moved_by)
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
            "Every gap and accuracy claim was decided; what stays unknown is whether the "
            "results carry over to larger models and data."
        )
    return Sentence("What stays unknown: " + "; ".join(parts) + ".", declared(stated))


def summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The study's plain summary: what was tested, where the noise acts (in the library's
    units), what a user should do (penalty strength) and what stays unknown; every verdict it
    states is the payload's.

    Args:
        payload: a ``results.json`` object of this study (design 7, or design 6 rescored).

    Returns:
        3 to 5 sentences, each declaring the verdicts it states.
    """
    claims = study_claims(payload)
    fits = temperature_fits(payload)
    states = noise_states(payload, fits)
    sentences = [
        scale_sentence(payload, claims),
        temperature_sentence(payload, fits, states) if fits else None,
        norm_sentence(payload, claims),
        decided_sentence(payload, claims),
        unknown_sentence(payload, claims, fits),
    ]
    return [sentence for sentence in sentences if sentence is not None]
