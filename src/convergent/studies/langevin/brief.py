"""What the ``langevin`` study tells a user in a minute (the README summary: what the noise did
at each temperature, the penalty, what stays unknown) and its "What to use" row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from convergent.studies.framework import Advice, Sentence, verdict_words
from convergent.studies.framework import stored_number as number
from convergent.studies.langevin.summary import lam_means, noise_states, temperature_fits
from convergent.studies.langevin.wording import (
    LABELS,
    TEMPERATURE_KINDS,
    StudyClaim,
    all_reproduced,
    declared,
    of_kind,
    significant,
    study_claims,
)

STATE_WORDS = {
    "lost": "lost the fit",
    "unmoved": "ended as plain gradient descent",
    "mixed": "acted in some variants only",
}


def _noise(payload: Mapping[str, Any]) -> Sentence | None:
    """Where the noise acted without wrecking the fit (the checks' measurements, no verdict)."""
    states = noise_states(payload, temperature_fits(payload))
    if not states:
        return None
    acting = [t for t, state in states.items() if state == "acts"]
    if acting:
        return Sentence(
            f"Use Langevin noise at the {' and '.join(acting)} temperature, where it changed "
            "the outcome and kept the pre-trained fit."
        )
    others = [
        f"{' and '.join(t for t, s in states.items() if s == state)}: {words}"
        for state, words in STATE_WORDS.items()
        if state in states.values()
    ]
    return Sentence(
        "Expect plain gradient descent's result from Langevin fine-tuning here: no tested "
        f"temperature changed the outcome and kept the fit ({'; '.join(others)})."
    )


def _norms(claims: Sequence[StudyClaim]) -> Sentence | None:
    bounded, grows = of_kind(claims, "bounded"), of_kind(claims, "grows")
    if not bounded and not grows:
        return None
    parts = []
    if bounded:
        words = verdict_words([c.verdict for c in bounded])
        lead = (
            "To keep the weights bounded under the noise, add a log or power penalty"
            if all_reproduced(bounded)
            else "A log or power penalty kept the weights bounded in some experiments only"
        )
        parts.append(f"{lead} ({words})")
    if grows:
        words = verdict_words([c.verdict for c in grows])
        grew = words == "reproduced"
        parts.append(
            f"without one the norm grew ({words})"
            if grew
            else f"whether the norm grows without one: {words}"
        )
    return Sentence("; ".join(parts) + ".", declared(bounded + grows))


def _gap(claims: Sequence[StudyClaim]) -> Sentence | None:
    gap = of_kind(claims, *TEMPERATURE_KINDS)
    if not gap:
        return None
    words = verdict_words([c.verdict for c in gap])
    return Sentence(
        "Whether a penalty stops the generalization gap creeping up, or keeps accuracy, stays "
        f"unknown ({words}): where the noise did not act or wrecked the fit, the claims could "
        "not be tested."
        if any(c.verdict == "untested" for c in gap)
        else f"The gap and accuracy claims were decided ({words}).",
        declared(gap),
    )


def brief(payload: Mapping[str, Any]) -> list[Sentence]:
    """The README summary: what the noise did, whether to add a penalty, what stays unknown."""
    claims = study_claims(payload)
    found = (_noise(payload), _norms(claims), _gap(claims))
    return [sentence for sentence in found if sentence is not None]


def _lams(payload: Mapping[str, Any], temperature: str) -> str:
    """lam per experiment and penalty: ``"attention: log 0.0011, power 0.0027"``."""
    return "; ".join(
        f"{LABELS.get(name, name)}: "
        + ", ".join(f"{p} {significant(lam)}" for p, lam in means.items())
        for name, means in lam_means(payload, temperature).items()
    )


def advice(payload: Mapping[str, Any]) -> list[Advice]:
    """The study's row of the "What to use" table."""
    claims = study_claims(payload)
    states = noise_states(payload, temperature_fits(payload))
    acting = [t for t, state in states.items() if state == "acts"]
    bounded = of_kind(claims, "bounded")
    when = (
        f"at the {' and '.join(acting)} temperature, where the noise acted"
        if acting
        else "not shown to change the outcome here (no claim that it ends as plain gradient "
        "descent does was tested: whether it does is unknown)"
    )
    rests_on: list[str] = []
    if all_reproduced(bounded):
        when += "; add the penalty to keep weights bounded"
        rests_on = [c.key for c in bounded]
    temperatures = payload["data"]["temperatures"]
    s = ", ".join(
        f"{significant(number(temperatures[t]))} ({t})"
        for t in payload["config"]["claim_temperatures"]
    )
    bound = str(payload["config"]["bound_temperature"])
    setting = (
        f"Langevin step size {significant(number(payload['config']['langevin_lr']))}; s = {s} "
        f"(s/2 the temperature, in loss units); penalty lam (loss units) {_lams(payload, bound)}"
    )
    untested = [c for c in of_kind(claims, *TEMPERATURE_KINDS) if c.verdict == "untested"]
    at = sorted({c.temperature for c in untested}, key=list(states).index)
    where = "every temperature" if len(at) == len(states) else f"the {' and '.join(at)} temperature"
    unknown = (
        f"the gap and accuracy claims at {where} (untested)"
        if untested
        else "larger models and data"
    )
    return [
        Advice(
            "Langevin fine-tuning with a log or power penalty",
            when,
            setting,
            tuple(c.key for c in claims),
            unknown,
            scale=_scale(payload),
            rests_on=tuple(rests_on),
        )
    ]


def _scale(payload: Mapping[str, Any]) -> str:
    """``"a vision-transformer regressor (d_model 16) on 100 generated Darcy-flow fields"``."""
    regime = payload["data"].get("regime") or {}
    return (
        f"a vision-transformer regressor (d_model {regime.get('d_model', '?')}) on "
        f"{regime.get('train_fields', '?')} generated Darcy-flow fields"
    )
