"""What the ``residual`` study tells a user, from a ``results.json`` payload: the summary's
sentences (what ran; the conditioning, claims 3 and 4; the speed-up, claim 2; the linear rate
by step size, claim 1; depth, claim 5), the README brief and the "What to use" row.

Claims are found by key and phrases by verdict (the records below); every number comes from
the payload: effects and intervals from the claim records, speeds, spectra and step sizes from
the stored runs (`measures.regimes_of`), so a rescored result rewrites its own words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.studies.framework import (
    VERDICTS,
    Advice,
    Sentence,
    claims_by_key,
    finite_mean,
    listed,
    verdict_of,
    verdict_words,
    verdicts_of,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.residual.claims import (
    CHANCE_FRACTION,
    DEPTH_CLASSES,
    DEPTH_KEY,
    FLOOR_KEY,
    LINEAR,
    RATE,
    RATE_SLOPE,
    SPEED,
    STEP_NAME,
    TRAINED_NAME,
    regime_key,
)
from convergent.studies.residual.measures import (
    Regime,
    chance_fractions,
    depth_gaps,
    regimes_of,
    seeds_in,
)

Payload = Mapping[str, Any]
TOO_LARGE = "the loss rose after the transient, so the step was too large for the theorem to apply"
# Phrases by verdict, filled from named fields.
CONDITIONING = {
    "reproduced": "Residuals keep the attention layer well conditioned: {at_zero}, while every "
    "beta > 0 kept it about {times} times higher{kept}",
    "not reproduced": "Residuals did not keep the attention layer's smallest singular value "
    "clear of zero: {at_zero}, and beta > 0 kept it only about {times} times higher{kept}",
    "inconclusive": "Whether residuals keep the attention layer's smallest singular value clear "
    "of zero is unclear: {at_zero}, and beta > 0 kept it about {times} times higher{kept}",
    "untested": "Whether residuals keep the attention layer's smallest singular value clear of "
    "zero is untested ({failed})",
}
RATE_PHRASES = {
    "reproduced": "the speed followed (sigma_min/sigma_max)^2: across beta > 0 log speed rose "
    "with the log ratio at a slope of {details} (at least {slope:g} needed)",
    "not reproduced": "the speed barely followed (sigma_min/sigma_max)^2: across beta > 0 log "
    "speed rose with the log ratio at a slope of only {details}, where the theorem's rate gives "
    "1 and at least {slope:g} was needed",
    "inconclusive": "whether the speed follows (sigma_min/sigma_max)^2 is unclear (slope of log "
    "speed on the log ratio {details}, against {slope:g})",
    "untested": "the rate could not be tested at {details}",
}
# Claim 2's effect is the slowest step up in beta (0 -> 0.25, ..., 0.75 -> 1), as a speed ratio.
SPEED_PHRASES = {
    "reproduced": "every step up in beta sped training up at {labels}, the slowest by {details}",
    "not reproduced": "some step up in beta slowed training down at {labels}, the slowest to "
    "{details}",
    "inconclusive": "not every step up in beta clearly sped training up at {labels}, the "
    "slowest {details}",
    "untested": "the speeds could not be compared at {details}",
}
LINEAR_PHRASES = {
    "reproduced": "held at {labels}",
    "not reproduced": "failed at {labels}, where the log loss peaked {details} above the bound, "
    "against a slack of {tolerance:g}",
    "inconclusive": "was unclear at {labels}, where the log loss peaked {details} above the "
    "bound, against a slack of {tolerance:g}",
    "untested": "could not be tested at {details}",
}
DEPTH_PHRASES = {
    "reproduced": "The residual advantage grew with depth (reproduced): {measured}",
    "not reproduced": "The residual advantage did not grow with depth (not reproduced): {measured}",
    "inconclusive": "Whether the residual advantage keeps growing with depth stays unknown "
    "(inconclusive): {measured}",
    "untested": "Whether the residual advantage grows with depth stays unknown (untested: {why})",
}
FLOOR_BRIEF = {
    "reproduced": "Keep residual connections (beta > 0) in attention models: they kept the "
    "attention block well conditioned where softmax alone collapsed rank",
    "not reproduced": "Residual connections did not keep the attention block well conditioned",
    "inconclusive": "Whether residual connections keep the attention block well conditioned is "
    "not resolved here",
    "untested": "Whether residual connections keep the attention block well conditioned is "
    "untested here",
}
DEPTH_BRIEF = {
    "reproduced": "Their advantage grew with depth",
    "not reproduced": "Their advantage did not grow with depth",
    "inconclusive": "Whether their advantage grows with depth stays open",
    "untested": "Whether their advantage grows with depth stays untested",
}


def two_figures(value: float) -> str:
    """Two significant figures; scientific notation outside [1e-4, 1e4)."""
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    if 1e-4 <= abs(value) < 1e4:
        digits = 1 - math.floor(math.log10(abs(value)))
        return f"{round(value, digits):.{max(digits, 0)}f}"
    return f"{value:.2g}"


def interval_text(record: Mapping[str, Any], scale: Any = None) -> str:
    """`` [low, high]`` of a claim's interval (through ``scale``), nothing for none."""
    if not record.get("interval"):
        return ""
    low, high = (number(v) for v in record["interval"])
    if scale is not None:
        low, high = scale(low), scale(high)
    return f" [{two_figures(low)}, {two_figures(high)}]"


def failed_checks(record: Mapping[str, Any]) -> str:
    """Which manipulation checks of a claim did not pass, by their short names."""
    names = [
        "'" + str(c["name"]).partition(": ")[0].partition(" (")[0] + "'"
        for c in record["checks"]
        if c["passed"] is not True
    ]
    if not names:
        return "every check passed"
    names = list(dict.fromkeys(names))
    return f"the check{'s' * (len(names) > 1)} {listed(names)} did not pass"


def _failed(record: Mapping[str, Any]) -> list[str]:
    return [c["name"] for c in record["checks"] if c["passed"] is not True]


def regime_lrs(regime: Regime) -> list[float]:
    return [number(run["lr"]) for seed in regime.seeds for run in regime.runs[seed]]


def regime_label(regime: Regime) -> str:
    if regime.lr is not None:
        return f"step size {regime.lr:g}"
    low, high = min(regime_lrs(regime)), max(regime_lrs(regime))
    return f"tuned step sizes of {low:g}-{high:g}" if low < high else f"tuned step size {low:g}"


def untested_at(regime: Regime, record: Mapping[str, Any]) -> str:
    """``"<regime>, where <why>"``: the claim's failed checks, after how many of the regime's
    runs diverged where any did (a diverged run has no speed or band to check)."""
    runs = [run for seed in regime.seeds for run in regime.runs[seed]]
    diverged = sum(bool(run.get("diverged")) for run in runs)
    why = failed_checks(record)
    if diverged:
        why = f"{diverged} of {len(runs)} runs diverged and {why}"
    return f"{regime_label(regime)}, where {why}"


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def selected_lrs(payload: Payload) -> dict[float, float]:
    """beta -> its selected step size in the tuned regime (from the tuning rows)."""
    rows = payload["data"].get("lr_tuning") or []
    return {number(r["beta"]): number(r["lr"]) for r in rows if r.get("selected")}


def regime_claims(
    payload: Payload, claim: str, regimes: Sequence[Regime] | None = None
) -> list[tuple[Regime, str, Mapping[str, Any]]]:
    """(regime, key, record) of ``claim`` (`LINEAR`, `SPEED` or `RATE`) in each regime the
    results hold it for, in the config's order."""
    held = claims_by_key(payload)
    if regimes is None:
        regimes = regimes_of(payload["config"], payload["data"])
    keys = ((regime, regime_key(claim, regime.lr)) for regime in regimes)
    return [(regime, key, held[key]) for regime, key in keys if key in held]


def _by_beta(regime: Regime, value: Any) -> dict[float, float]:
    """beta -> the mean over seeds of ``value(seed, beta)``."""
    return {b: finite_mean([value(s, b) for s in regime.seeds]) for b in regime.betas}


def _grouped(
    items: Sequence[tuple[str, str, str]], phrases: Mapping[str, str], **fields: Any
) -> str:
    """``(verdict, label, detail)`` items as one clause per verdict (in `VERDICTS` order): the
    verdict's phrase with ``{labels}``, ``{details}`` and ``fields`` filled in, then the
    verdict; the last clause after a "but"."""
    clauses = []
    for verdict in VERDICTS:
        chosen = [(label, detail) for v, label, detail in items if v == verdict]
        if chosen:
            labels = listed([label for label, _ in chosen])
            parts = [detail for _, detail in chosen]
            # "at A, where x, and at B, where y": a plain "and" would read "x and B" as one.
            clause = any(", where " in part for part in parts)
            details = ", and at ".join(parts) if clause else listed(parts)
            phrase = phrases[verdict].format(labels=labels, details=details, **fields)
            clauses.append(f"{phrase} ({verdict})")
    return clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + ", but " + clauses[-1]


def _scale(payload: Payload, regimes: Sequence[Regime]) -> Sentence:
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


def _conditioning(payload: Payload, regimes: Sequence[Regime]) -> Sentence | None:
    """Claim 4 (the sigma_min floor, first regime) and claim 3 (the rate, per regime)."""
    if FLOOR_KEY not in claims_by_key(payload) or not regimes:
        return None
    first, verdict, record = (
        regimes[0],
        verdict_of(payload, FLOOR_KEY),
        claims_by_key(payload)[FLOOR_KEY],
    )
    floors, collapsed = (
        {b: finite_mean([m.row[key] for m in first.at(b)]) for b in first.betas}
        for key in ("residual_sigma_min_min", "squared_ratio_mean")
    )
    positive = [b for b in first.betas if b > 0]
    decades = number(record["effect"])
    ratio = f"log10 ratio {two_figures(decades)}{interval_text(record)}"
    at_zero = (
        f"at beta 0 softmax attention collapsed rank ((sigma_min/sigma_max)^2 of "
        f"{two_figures(collapsed.get(0.0, math.nan))}) and the smallest singular value of the "
        f"attention output plus residual fell to {two_figures(floors.get(0.0, math.nan))}"
    )
    kept = (
        f" ({two_figures(floors[positive[0]])} at beta {positive[0]:g}, "
        f"{two_figures(floors[positive[-1]])} at beta {positive[-1]:g}; {ratio}, {verdict})"
        if positive
        else f" ({ratio}, {verdict})"
    )
    opening = CONDITIONING[verdict].format(
        at_zero=at_zero, times=two_figures(10**decades), kept=kept, failed=failed_checks(record)
    )
    declared = {FLOOR_KEY: verdict}
    items, too_large = [], []
    for regime, key, rate in regime_claims(payload, RATE, regimes):
        declared[key] = str(rate["verdict"])
        if declared[key] == "untested" and _failed(rate) == [STEP_NAME]:
            too_large.append(regime_label(regime))
        elif declared[key] == "untested":
            items.append(("untested", regime_label(regime), untested_at(regime, rate)))
        else:
            detail = f"{two_figures(number(rate['effect']))}{interval_text(rate)}"
            items.append(
                (declared[key], regime_label(regime), f"{detail} at {regime_label(regime)}")
            )
    if too_large:
        items.append(("untested", "", f"{listed(too_large)}, where {TOO_LARGE}"))
    rates = f"; {_grouped(items, RATE_PHRASES, slope=RATE_SLOPE)}" if items else ""
    return Sentence(opening + rates + ".", declared)


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


def _speed(payload: Payload, regimes: Sequence[Regime]) -> Sentence | None:
    """Claim 2 per regime, with the tuned step sizes and the fastest tuned beta."""
    declared, items = {}, []
    for regime, key, record in regime_claims(payload, SPEED, regimes):
        declared[key] = str(record["verdict"])
        detail = (
            untested_at(regime, record)
            if declared[key] == "untested"
            else f"{two_figures(math.exp(number(record['effect'])))}x{interval_text(record, math.exp)}"
        )
        items.append((declared[key], regime_label(regime), detail))
    if not items:
        return None
    text = f"{_speed_opener(set(declared.values()))}: {_grouped(items, SPEED_PHRASES)}"
    selected = selected_lrs(payload)
    if len(selected) > 1:
        low, high = min(selected), max(selected)
        change = "fell" if selected[high] < selected[low] else "went"
        text += (
            f"; the best step size that never diverged on the selection seeds {change} from "
            f"{selected[low]:g} at beta {low:g} to {selected[high]:g} at beta {high:g}"
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


def _linear(payload: Payload, regimes: Sequence[Regime]) -> Sentence | None:
    """Claim 1 per regime: which step sizes it holds at, fails at, or was too large for."""
    declared, items, unsteady = {}, [], []
    lrs: dict[str, list[float]] = {verdict: [] for verdict in VERDICTS}
    too_large: list[Regime] = []
    for regime, key, record in regime_claims(payload, LINEAR, regimes):
        verdict = declared[key] = str(record["verdict"])
        if verdict == "untested" and _failed(record) == [STEP_NAME]:
            too_large.append(regime)
            unsteady.append(record)
            continue
        unsteady += [record] * (verdict == "not reproduced")
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
    config = payload["config"]
    tolerance = number(config["envelope_tolerance"])
    text = (
        f"A linear rate (the loss staying under a geometric bound after the first "
        f"{number(config['transient_fraction']):.0%} of the steps) "
        + _grouped(items, LINEAR_PHRASES, tolerance=tolerance)
    )
    held = lrs["reproduced"]
    larger = lrs["not reproduced"] + [lr for regime in too_large for lr in regime_lrs(regime)]
    if held and larger and max(held) < min(larger):
        text += (
            f", so count on a linear rate only with small steps (here {max(held):g}, not "
            f"{min(larger):g} or more)"
        )
        if all(TRAINED_NAME not in _failed(record) for record in unsteady):
            text += "; the larger steps still cut the loss at least tenfold, just not steadily"
    elif held and not larger:
        text += ", so a linear rate can be counted on at every step size tested"
    elif lrs["not reproduced"] and not held:
        text += ", so do not count on a linear rate at these step sizes"
    return Sentence(text + ".", declared)


def depth_errors(runs: Sequence[Mapping[str, Any]], depth: int) -> dict[float, float]:
    """beta (0 and 1) -> the mean validation error at ``depth``."""
    at = [
        (number(r["beta"]), number(r["validation_error"])) for r in runs if int(r["depth"]) == depth
    ]
    return {beta: finite_mean([error for b, error in at if b == beta]) for beta in (0.0, 1.0)}


def at_chance(runs: Sequence[Mapping[str, Any]]) -> str:
    """Which arm stayed at chance at which depths, as a clause (empty when none did)."""
    fractions = chance_fractions(runs, DEPTH_CLASSES)
    clauses = []
    for beta, arm in ((0.0, "without residuals"), (1.0, "with residuals")):
        depths = [str(d) for (d, b), v in fractions.items() if b == beta and v > CHANCE_FRACTION]
        if depths:
            clauses.append(f"{arm} at {listed(depths)} layers")
    if not clauses:
        return ""
    return (
        f"{listed(clauses)} the train loss stayed within {1 - CHANCE_FRACTION:.0%} of chance "
        "(ln 2), so the gap had no room to grow there"
    )


def depth_sentence(payload: Payload) -> Sentence:
    """Claim 5: the gap by depth, which arm stayed at chance, the deepest model's errors."""
    runs = payload["data"].get("depth_runs") or []
    if DEPTH_KEY not in claims_by_key(payload) or not runs:
        return Sentence(
            "Depth was not run, so whether residuals matter more in deeper models stays unknown."
        )
    verdict, record = verdict_of(payload, DEPTH_KEY), claims_by_key(payload)[DEPTH_KEY]
    seeds = seeds_in(payload["config"], runs)
    per_seed = [depth_gaps([run for run in runs if int(run["seed"]) == seed]) for seed in seeds]
    depths = sorted({depth for gaps_of_seed in per_seed for depth in gaps_of_seed})
    gaps = {d: finite_mean([g.get(d, math.nan) for g in per_seed]) for d in depths}
    by_depth = [f"{two_figures(gap)} at {depth} layers" for depth, gap in gaps.items()]
    measured = (
        f"the training-loss gap beta 0 minus beta 1 on MiniLM was {listed(by_depth)} (smallest "
        f"growth between depths {two_figures(number(record['effect']))}{interval_text(record)})"
    )
    why = at_chance(runs) or failed_checks(record)
    text = DEPTH_PHRASES[verdict].format(measured=measured, why=why)
    deepest = max(int(run["depth"]) for run in runs)
    errors = depth_errors(runs, deepest)
    if errors[1.0] < errors[0.0]:
        text += (
            f"; at {deepest} layers the validation error was {two_figures(errors[1.0])} with "
            f"residuals and {two_figures(errors[0.0])} without, so keep them in deep models either way"
        )
    return Sentence(text + ".", {DEPTH_KEY: verdict})


def summary(payload: Payload) -> list[Sentence]:
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


def brief(payload: Payload) -> list[Sentence]:
    """The README summary: keep residuals, how to set the step size, what the speed claims
    showed, and the depth claim."""
    held = claims_by_key(payload)
    found: list[Sentence] = []
    if FLOOR_KEY in held:
        verdict = verdict_of(payload, FLOOR_KEY)
        found.append(Sentence(f"{FLOOR_BRIEF[verdict]} ({verdict}).", {FLOOR_KEY: verdict}))
    linear = verdicts_of(payload, [key for _, key, _ in regime_claims(payload, LINEAR)])
    if linear:
        kinds, lower = set(linear.values()), selected_lrs(payload)
        betas = sorted(lower)
        lead = (
            "Lower the step size as beta grows"
            if len(betas) > 1 and lower[betas[-1]] < lower[betas[0]]
            else "Tune the step size per beta"
        )
        if "reproduced" in kinds and kinds != {"reproduced"}:
            rate = "count on a linear rate only with small steps"
        elif kinds == {"reproduced"}:
            rate = "a linear rate held at every step size tested"
        else:
            rate = "a linear rate was not shown at these step sizes"
        words = verdict_words(list(linear.values()))
        found.append(Sentence(f"{lead}, and {rate} ({words}).", linear))
    keys = [key for claim in (SPEED, RATE) for _, key, _ in regime_claims(payload, claim)]
    speed = verdicts_of(payload, keys)
    if speed:
        text = (
            "Residuals sped training up steadily, at a rate set by the conditioning"
            if set(speed.values()) == {"reproduced"}
            else "A steady speed-up from residuals, at a rate set by the attention block's "
            "conditioning, was not shown"
        )
        found.append(Sentence(f"{text} ({verdict_words(list(speed.values()))}).", speed))
    if DEPTH_KEY in held:
        verdict, runs = verdict_of(payload, DEPTH_KEY), payload["data"]["depth_runs"]
        errors = depth_errors(runs, max(int(run["depth"]) for run in runs))
        why = ", as deep models without them barely trained" if at_chance(runs) else ""
        keep = "; keep them in deep models either way" if errors[1.0] < errors[0.0] else ""
        text = f"{DEPTH_BRIEF[verdict]}{why} ({verdict}){keep}."
        found.append(Sentence(text, {DEPTH_KEY: verdict}))
    return found


def advice(payload: Payload) -> list[Advice]:
    """The study's row of the "What to use" table."""
    keys, config = list(claims_by_key(payload)), payload["config"]
    floor = verdict_of(payload, FLOOR_KEY) if FLOOR_KEY in keys else "untested"
    when = (
        "in attention models: they kept attention well conditioned"
        if floor == "reproduced"
        else "not shown to help here"
    )
    lrs = selected_lrs(payload)
    steady = [
        f"{regime.lr:g}"
        for regime, _, record in regime_claims(payload, LINEAR)
        if regime.lr is not None and record["verdict"] == "reproduced"
    ]
    parts = [f"residual weight beta in {{{', '.join(f'{float(b):g}' for b in config['betas'])}}}"]
    if len(lrs) > 1:
        low, high = min(lrs), max(lrs)
        parts.append(
            f"best step size that never diverged {lrs[low]:g} at beta {low:g}, "
            f"{lrs[high]:g} at beta {high:g}"
        )
    if steady:
        parts.append(f"linear rate at step size {', '.join(steady)}")
    speed = [key for _, key, _ in regime_claims(payload, SPEED)][:1]
    unknown = [
        text
        for key, text in (
            (DEPTH_KEY, "whether the advantage grows with depth"),
            *((key, "a steady speed-up with beta") for key in speed),
        )
        if key in keys and verdict_of(payload, key) != "reproduced"
    ]
    scale = (
        f"a one-layer Transformer (d_model {config['d_model']}, no LayerNorm) on "
        f"{config['examples']} weather-hourly windows, full-batch gradient descent"
    )
    return [
        Advice(
            "Residual connections",
            when,
            "; ".join(parts),
            tuple(keys),
            "; ".join(unknown) or "larger models",
            scale=scale,
            rests_on=(FLOOR_KEY,) if floor == "reproduced" else (),
        )
    ]
