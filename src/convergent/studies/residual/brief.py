"""What the ``residual`` study tells a user in a minute: keep residuals, how to set the step
size, the speed and depth claims (the README summary), and its "What to use" row; the report
keeps the long findings (`summary`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convergent.studies.framework import (
    Advice,
    Sentence,
    claims_by_key,
    verdict_of,
    verdict_words,
    verdicts_of,
)
from convergent.studies.residual.claims import DEPTH_KEY, FLOOR_KEY, LINEAR, RATE, SPEED, regime_key
from convergent.studies.residual.depth_summary import at_chance, depth_errors
from convergent.studies.residual.measures import regimes_of
from convergent.studies.residual.wording import selected_lrs

FLOOR_TEXT = {
    "reproduced": "Keep residual connections (beta > 0) in attention models: they kept the "
    "attention block well conditioned where softmax alone collapsed rank",
    "not reproduced": "Residual connections did not keep the attention block well conditioned",
    "inconclusive": "Whether residual connections keep the attention block well conditioned is "
    "not resolved here",
    "untested": "Whether residual connections keep the attention block well conditioned is "
    "untested here",
}


def _regime_keys(payload: Mapping[str, Any], claim: str) -> list[str]:
    """``claim``'s key in each step-size regime the results hold, in the config's order."""
    held = claims_by_key(payload)
    keys = [regime_key(claim, r.lr) for r in regimes_of(payload["config"], payload["data"])]
    return [key for key in keys if key in held]


def _floor(payload: Mapping[str, Any]) -> Sentence | None:
    if FLOOR_KEY not in claims_by_key(payload):
        return None
    verdict = verdict_of(payload, FLOOR_KEY)
    return Sentence(f"{FLOOR_TEXT[verdict]} ({verdict}).", {FLOOR_KEY: verdict})


def _steps(payload: Mapping[str, Any]) -> Sentence | None:
    verdicts = verdicts_of(payload, _regime_keys(payload, LINEAR))
    if not verdicts:
        return None
    held = set(verdicts.values())
    words = verdict_words(list(verdicts.values()))
    lower = selected_lrs(payload)
    betas = sorted(lower)
    lead = (
        "Lower the step size as beta grows"
        if len(betas) > 1 and lower[betas[-1]] < lower[betas[0]]
        else "Tune the step size per beta"
    )
    if "reproduced" in held and held != {"reproduced"}:
        rate = "count on a linear rate only with small steps"
    elif held == {"reproduced"}:
        rate = "a linear rate held at every step size tested"
    else:
        rate = "a linear rate was not shown at these step sizes"
    return Sentence(f"{lead}, and {rate} ({words}).", verdicts)


def _speed(payload: Mapping[str, Any]) -> Sentence | None:
    verdicts = verdicts_of(payload, _regime_keys(payload, SPEED) + _regime_keys(payload, RATE))
    if not verdicts:
        return None
    held = set(verdicts.values())
    words = verdict_words(list(verdicts.values()))
    if held == {"reproduced"}:
        text = "Residuals sped training up steadily, at a rate set by the conditioning"
    else:
        text = (
            "A steady speed-up from residuals, at a rate set by the attention block's "
            "conditioning, was not shown"
        )
    return Sentence(f"{text} ({words}).", verdicts)


DEPTH_TEXT = {
    "reproduced": "Their advantage grew with depth",
    "not reproduced": "Their advantage did not grow with depth",
    "inconclusive": "Whether their advantage grows with depth stays open",
    "untested": "Whether their advantage grows with depth stays untested",
}


def _depth(payload: Mapping[str, Any]) -> Sentence | None:
    if DEPTH_KEY not in claims_by_key(payload):
        return None
    verdict = verdict_of(payload, DEPTH_KEY)
    runs = payload["data"]["depth_runs"]
    deepest = max(int(run["depth"]) for run in runs)
    errors = depth_errors(runs, deepest)
    why = ", as deep models without them barely trained" if at_chance(runs) else ""
    keep = "; keep them in deep models either way" if errors[1.0] < errors[0.0] else ""
    return Sentence(f"{DEPTH_TEXT[verdict]}{why} ({verdict}){keep}.", {DEPTH_KEY: verdict})


def brief(payload: Mapping[str, Any]) -> list[Sentence]:
    """The README summary: keep residuals, how to set the step size, what the speed claims
    showed, and the depth claim."""
    found = (_floor(payload), _steps(payload), _speed(payload), _depth(payload))
    return [sentence for sentence in found if sentence is not None]


def advice(payload: Mapping[str, Any]) -> list[Advice]:
    """The study's row of the "What to use" table."""
    keys = list(claims_by_key(payload))
    floor = verdict_of(payload, FLOOR_KEY) if FLOOR_KEY in keys else "untested"
    when = (
        "in attention models: they kept attention well conditioned"
        if floor == "reproduced"
        else "not shown to help here"
    )
    betas = [float(b) for b in payload["config"]["betas"]]
    lrs = selected_lrs(payload)
    linear = verdicts_of(payload, _regime_keys(payload, LINEAR))
    steady = [
        f"{r.lr:g}"
        for r in regimes_of(payload["config"], payload["data"])
        if r.lr is not None and linear.get(regime_key(LINEAR, r.lr)) == "reproduced"
    ]
    parts = [f"residual weight beta in {{{', '.join(f'{b:g}' for b in betas)}}}"]
    if len(lrs) > 1:
        low, high = min(lrs), max(lrs)
        parts.append(
            f"best step size that never diverged {lrs[low]:g} at beta {low:g}, {lrs[high]:g} at beta {high:g}"
        )
    if steady:
        parts.append(f"linear rate at step size {', '.join(steady)}")
    unknown = [
        text
        for key, text in (
            (DEPTH_KEY, "whether the advantage grows with depth"),
            *((k, "a steady speed-up with beta") for k in _regime_keys(payload, SPEED)[:1]),
        )
        if key in keys and verdict_of(payload, key) != "reproduced"
    ]
    return [
        Advice(
            "Residual connections",
            when,
            "; ".join(parts),
            tuple(keys),
            "; ".join(unknown) or "larger models",
            scale=(
                f"a one-layer Transformer (d_model {payload['config']['d_model']}, no "
                f"LayerNorm) on {payload['config']['examples']} weather-hourly windows, "
                "full-batch gradient descent"
            ),
            rests_on=(FLOOR_KEY,) if floor == "reproduced" else (),
        )
    ]
