"""The ``residual`` study's plain summary: what residual connections did for the conditioning
and the convergence of gradient descent, in sentences written from the verdicts.

Five sentences: what ran and at what scale; what residuals do to the attention block's
smallest singular value and whether the speed follows (sigma_min/sigma_max)^2 (claims 3 and
4); whether every step up in beta speeds training up, and the step sizes it needs (claim 2);
where convergence is linear and where the step was too large for the theorem to apply (claim
1, by step size); the depth claim (claim 5) and what stays unknown. Every number comes from the
payload: effects and intervals from the claim records, speeds, spectra and step sizes from the
stored runs (`measures.regimes_of`), so a rescored or re-run result rewrites its own summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.studies.framework import (
    VERDICTS,
    Sentence,
    claims_by_key,
    finite_mean,
    listed,
    verdict_of,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.residual.claims import (
    FLOOR_KEY,
    LINEAR,
    RATE,
    RATE_SLOPE,
    SPEED,
    STEP_NAME,
    TRAINED_NAME,
)
from convergent.studies.residual.depth_summary import depth_sentence
from convergent.studies.residual.measures import Regime, regimes_of, seeds_in
from convergent.studies.residual.wording import (
    counted,
    failed_checks,
    held_key,
    interval_text,
    regime_label,
    regime_lrs,
    selected_lrs,
    two_figures,
    untested_at,
)


def _regime_claims(
    payload: Mapping[str, Any], regimes: Sequence[Regime], claim: str
) -> list[tuple[Regime, str, Mapping[str, Any]]]:
    """Per regime whose ``claim`` (`LINEAR`, `SPEED` or `RATE`) the results hold: the regime,
    the claim's key and its record."""
    claims = claims_by_key(payload)
    found = ((regime, held_key(payload, claim, regime)) for regime in regimes)
    return [(regime, key, claims[key]) for regime, key in found if key is not None]


def _failed(record: Mapping[str, Any], check: str) -> bool:
    """Whether the claim's check named ``check`` did not pass."""
    return any(c["name"] == check and c["passed"] is not True for c in record["checks"])


def _too_large(record: Mapping[str, Any]) -> bool:
    """Untested only because the loss rose after the transient (the step-size check)."""
    failed = [c["name"] for c in record["checks"] if c["passed"] is not True]
    return failed == [STEP_NAME]


TOO_LARGE = "the loss rose after the transient, so the step was too large for the theorem to apply"


def _by_beta(regime: Regime, value: Any) -> dict[float, float]:
    """beta -> the mean over seeds of ``value(seed, beta)``."""
    return {b: finite_mean([value(s, b) for s in regime.seeds]) for b in regime.betas}


def _floor_rows(regime: Regime, key: str) -> dict[float, float]:
    return {b: finite_mean([m.row[key] for m in regime.at(b)]) for b in regime.betas}


def _grouped(items: Sequence[tuple[str, str, str]], phrases: Mapping[str, str]) -> str:
    """``(verdict, label, detail)`` items as one clause per verdict (in `VERDICTS` order): the
    verdict's phrase with ``{labels}`` and ``{details}`` filled in, then the verdict; the last
    clause after a "but"."""
    clauses = []
    for verdict in VERDICTS:
        chosen = [(label, detail) for v, label, detail in items if v == verdict]
        if chosen:
            labels = listed([label for label, _ in chosen])
            parts = [detail for _, detail in chosen]
            # "at A, where x, and at B, where y": a plain "and" would read "x and B" as one.
            clause = any(", where " in part for part in parts)
            details = ", and at ".join(parts) if clause else listed(parts)
            phrase = phrases[verdict].format(labels=labels, details=details)
            clauses.append(f"{phrase} ({verdict})")
    return clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + ", but " + clauses[-1]


def _scale(payload: Mapping[str, Any], regimes: Sequence[Regime]) -> Sentence:
    config, data = payload["config"], payload["data"]
    seeds = len(seeds_in(config, data["one_layer_runs"]))
    betas = ", ".join(f"{b:g}" for b in regimes[0].betas) if regimes else ""
    settings = listed([f"{regime_label(r)} ({r.steps} steps)" for r in regimes] or ["no step size"])
    text = (
        f"We ran full-batch gradient descent on a one-layer Transformer (softmax attention and "
        f"a feed-forward layer, model width {config['d_model']}, no LayerNorm) with residual "
        f"weight beta in {{{betas}}}, fitting {config['examples']} windows of "
        f"{config['window']} hours of weather-hourly, {counted(seeds, 'seed')} each, "
        f"at {settings}"
    )
    depth_runs = data.get("depth_runs") or []
    if depth_runs:
        depths = [str(d) for d in sorted({int(run["depth"]) for run in depth_runs})]
        text += (
            f"; for depth, MiniLM cut or extended to {listed(depths)} layers was fine-tuned "
            f"with and without residuals on {config['train_examples']} rt-sentences "
            f"({counted(len(seeds_in(config, depth_runs)), 'seed')})"
        )
    if any(claim.get("preview") for claim in payload["claims"]):
        text += ", too few seeds for more than a preview"
    return Sentence(text + ".")


def _conditioning(payload: Mapping[str, Any], regimes: Sequence[Regime]) -> Sentence | None:
    """Claim 4 (the sigma_min floor, first regime) and claim 3 (the rate bound, per regime)."""
    claims = claims_by_key(payload)
    name = held_key(payload, FLOOR_KEY)
    if name is None or not regimes:
        return None
    first, verdict, record = regimes[0], verdict_of(payload, name), claims[name]
    floors = _floor_rows(first, "residual_sigma_min_min")
    collapsed = _floor_rows(first, "squared_ratio_mean").get(0.0, math.nan)
    positive = [b for b in first.betas if b > 0]
    decades = number(record["effect"])
    ratio = f"log10 ratio {two_figures(decades)}{interval_text(record)}"
    at_zero = (
        f"at beta 0 softmax attention collapsed rank ((sigma_min/sigma_max)^2 of "
        f"{two_figures(collapsed)}) and the smallest singular value of the attention output plus "
        f"residual fell to {two_figures(floors.get(0.0, math.nan))}"
    )
    kept = (
        f" ({two_figures(floors[positive[0]])} at beta {positive[0]:g}, "
        f"{two_figures(floors[positive[-1]])} at beta {positive[-1]:g}; {ratio}, {verdict})"
        if positive
        else f" ({ratio}, {verdict})"
    )
    opening = {
        "reproduced": f"Residuals keep the attention layer well conditioned: {at_zero}, while "
        f"every beta > 0 kept it about {two_figures(10**decades)} times higher{kept}",
        "not reproduced": f"Residuals did not keep the attention layer's smallest singular "
        f"value clear of zero: {at_zero}, and beta > 0 kept it only about "
        f"{two_figures(10**decades)} times higher{kept}",
        "inconclusive": "Whether residuals keep the attention layer's smallest singular value "
        f"clear of zero is unclear: {at_zero}, and beta > 0 kept it about "
        f"{two_figures(10**decades)} times higher{kept}",
        "untested": "Whether residuals keep the attention layer's smallest singular value "
        f"clear of zero is untested ({failed_checks(record)})",
    }[verdict]
    declared = {name: verdict}
    items, too_large = [], []
    for regime, rate, record in _regime_claims(payload, regimes, RATE):
        declared[rate] = str(record["verdict"])
        if declared[rate] == "untested" and _too_large(record):
            too_large.append(regime_label(regime))
            continue
        detail = (
            untested_at(regime, record)
            if declared[rate] == "untested"
            else f"{two_figures(number(record['effect']))}{interval_text(record)} at {regime_label(regime)}"
        )
        items.append((declared[rate], regime_label(regime), detail))
    if too_large:
        items.append(("untested", "", f"{listed(too_large)}, where {TOO_LARGE}"))
    phrases = {
        "reproduced": "the speed followed (sigma_min/sigma_max)^2: across beta > 0 log speed "
        f"rose with the log ratio at a slope of {{details}} (at least {RATE_SLOPE:g} needed)",
        "not reproduced": "the speed barely followed (sigma_min/sigma_max)^2: across beta > 0 "
        "log speed rose with the log ratio at a slope of only {details}, where the theorem's "
        f"rate gives 1 and at least {RATE_SLOPE:g} was needed",
        "inconclusive": "whether the speed follows (sigma_min/sigma_max)^2 is unclear (slope of "
        f"log speed on the log ratio {{details}}, against {RATE_SLOPE:g})",
        "untested": "the rate could not be tested at {details}",
    }
    text = opening + (f"; {_grouped(items, phrases)}" if items else "")
    return Sentence(text + ".", declared)


def _speed_opener(verdicts: set[str]) -> str:
    """What the speed-up verdicts over the regimes add up to, before each is stated."""
    held, failed = "reproduced" in verdicts, "not reproduced" in verdicts
    if held and failed:
        return "The speed-up from residuals depended on the setting"
    if held and "inconclusive" in verdicts:
        return "Residuals sped training up steadily in some settings only"
    if held:
        measured = " where their speed could be measured" * ("untested" in verdicts)
        return f"So use residuals (beta > 0){measured}"
    if failed:
        return "Residuals bought no steady speed-up here"
    if "inconclusive" in verdicts:
        return "A steady speed-up from residuals was not resolved here"
    return "Whether residuals speed training up is untested here"


def _speed(payload: Mapping[str, Any], regimes: Sequence[Regime]) -> Sentence | None:
    """Claim 2 per regime, with the tuned step sizes and the fastest tuned beta."""
    declared, items = {}, []
    for regime, name, record in _regime_claims(payload, regimes, SPEED):
        declared[name] = str(record["verdict"])
        detail = (
            untested_at(regime, record)
            if declared[name] == "untested"
            else f"{two_figures(math.exp(number(record['effect'])))}x{interval_text(record, math.exp)}"
        )
        items.append((declared[name], regime_label(regime), detail))
    if not items:
        return None
    opener = _speed_opener(set(declared.values()))
    # The effect is the slowest step up in beta (0 -> 0.25, ..., 0.75 -> 1), as a speed ratio.
    phrases = {
        "reproduced": "every step up in beta sped training up at {labels}, the slowest by "
        "{details}",
        "not reproduced": "some step up in beta slowed training down at {labels}, the slowest "
        "to {details}",
        "inconclusive": "not every step up in beta clearly sped training up at {labels}, the "
        "slowest {details}",
        "untested": "the speeds could not be compared at {details}",
    }
    text = f"{opener}: {_grouped(items, phrases)}"
    selected = selected_lrs(payload)
    if len(selected) > 1:
        low, high = min(selected), max(selected)
        change = "fell" if selected[high] < selected[low] else "went"
        text += (
            f"; the best step size that never diverged on the selection seeds {change} from "
            f"{selected[low]:g} at "
            f"beta {low:g} to {selected[high]:g} at beta {high:g}"
        )
        if selected[high] < selected[low]:
            text += ", so lower the step size as beta grows"
    tuned = next((r for r in regimes if r.lr is None), None)
    if tuned is not None and 0.0 in tuned.betas:
        speeds = _by_beta(tuned, lambda s, b: tuned.speeds[s][b])
        fastest = max(speeds, key=lambda b: speeds[b] if math.isfinite(speeds[b]) else -math.inf)
        if fastest not in (0.0, tuned.betas[-1]) and speeds[0.0] > 0:
            text += (
                f", and with tuned step sizes beta {fastest:g} was the fastest "
                f"({two_figures(speeds[fastest] / speeds[0.0])}x beta 0)"
            )
    return Sentence(text + ".", declared)


def _linear(payload: Mapping[str, Any], regimes: Sequence[Regime]) -> Sentence | None:
    """Claim 1 per regime: which step sizes it holds at, fails at, or was too large for."""
    claims = claims_by_key(payload)
    declared, items = {}, []
    lrs: dict[str, list[float]] = {verdict: [] for verdict in VERDICTS}
    too_large: list[Regime] = []
    for regime, name, record in _regime_claims(payload, regimes, LINEAR):
        verdict = declared[name] = str(record["verdict"])
        if verdict == "untested" and _too_large(record):
            too_large.append(regime)
            continue
        lrs[verdict] += regime_lrs(regime)
        detail = (
            untested_at(regime, record)
            if verdict == "untested"
            else f"{two_figures(number(record['effect']))}{interval_text(record)}"
        )
        items.append((verdict, regime_label(regime), detail))
    if too_large:
        labels = listed([regime_label(regime) for regime in too_large])
        items.append(("untested", labels, f"{labels}, where {TOO_LARGE}"))
    if not items:
        return None
    fraction = number(payload["config"]["transient_fraction"])
    tolerance = number(payload["config"]["envelope_tolerance"])
    phrases = {
        "reproduced": "held at {labels}",
        "not reproduced": "failed at {labels}, where the log loss peaked {details} above the "
        f"bound, against a slack of {tolerance:g}",
        "inconclusive": "was unclear at {labels}, where the log loss peaked {details} above the "
        f"bound, against a slack of {tolerance:g}",
        "untested": "could not be tested at {details}",
    }
    text = (
        f"A linear rate (the loss staying under a geometric bound after the first "
        f"{fraction:.0%} of the steps) {_grouped(items, phrases)}"
    )
    held = lrs["reproduced"]
    larger = lrs["not reproduced"] + [lr for regime in too_large for lr in regime_lrs(regime)]
    unsteady = [claims[n] for n, v in declared.items() if v == "not reproduced"] + [
        claims[held_key(payload, LINEAR, regime) or ""] for regime in too_large
    ]
    trained = all(not _failed(record, TRAINED_NAME) for record in unsteady)
    if held and larger and max(held) < min(larger):
        text += (
            f", so count on a linear rate only with small steps (here {max(held):g}, not "
            f"{min(larger):g} or more)"
        )
        if trained:
            text += "; the larger steps still cut the loss at least tenfold, just not steadily"
    elif held and not larger:
        text += ", so a linear rate can be counted on at every step size tested"
    elif lrs["not reproduced"] and not held:
        text += ", so do not count on a linear rate at these step sizes"
    return Sentence(text + ".", declared)


def summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The plain sentences of a ``residual`` ``results.json`` payload (`framework.Sentence`)."""
    regimes = [r for r in regimes_of(payload["config"], payload["data"]) if r.seeds]
    sentences = [
        _scale(payload, regimes),
        _conditioning(payload, regimes),
        _speed(payload, regimes),
        _linear(payload, regimes),
        depth_sentence(payload),
    ]
    return [sentence for sentence in sentences if sentence is not None]
