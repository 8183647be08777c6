"""The plain summary of the ``descent`` study: what a user can take from its verdicts.

Every sentence is written from a ``results.json`` payload: the verdicts (`verdict_of`), the
claims' effects, intervals and manipulation checks, the selected points (``data``) and the
tuning grids, so a rescored or re-run result rewrites its own summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convergent.studies.descent.checks import (
    BUMP_CHECK,
    CLEAN_KEY,
    CLEAN_PAPER_KEY,
    LANGUAGE_CLEAN_KEY,
    TEXT_MONOTONE_KEY,
    VIDEO_MONOTONE_KEY,
    VIDEO_NOISE_KEY,
)
from convergent.studies.descent.language_summary import language_sentence
from convergent.studies.descent.selection import constraints_act, denoising_score, selected_index
from convergent.studies.descent.wording import (
    Claim,
    binding,
    check_named,
    grouped,
    shift_labels,
    signed_points,
    strength,
    test_sentences,
    what_ran,
)
from convergent.studies.framework import Sentence, claims_by_key, listed, verdict_of, verdicts_of


def _ruled_out(payload: Mapping[str, Any], part: str) -> list[float]:
    """The alphas whose every constrained grid point the tuning of ``part`` ruled out (no
    validation score: outside its accuracy filter)."""
    record = next(
        methods["constrained"] for key, methods in payload["tuning"].items() if key.startswith(part)
    )
    points = record["points"]
    alphas = dict.fromkeys(point["alpha"] for point in points)
    return [
        alpha
        for alpha in alphas
        if all(point["validation"] is None for point in points if point["alpha"] == alpha)
    ]


def _scale(payload: Mapping[str, Any]) -> Sentence:
    config, data = payload["config"], payload["data"]
    layers = config.get("text_layers")
    model = "MiniLM-L6" if layers is None else f"MiniLM-L6 cut to {layers} layers"
    sentences = test_sentences(data["text"]["runs"])
    test = f", {sentences:,} test sentences" if sentences else ""
    grids = {
        len(record["points"])
        for key, part in payload["tuning"].items()
        if key.startswith(("(a)", "(b)"))  # part (c)'s grids are its own sentence's
        for record in part.values()
    }
    grid = f" on equal {grids.pop()}-point grids" if len(grids) == 1 else ""
    seeds = len(config["seeds"])
    return Sentence(
        "We compared layer-wise descent constraints (each layer must cut the loss by a fraction "
        "alpha of the previous layer's, enforced by one multiplier lambda per layer learned "
        f"during training) with plain training (ERM) on {model} for rt-sentences sentiment "
        f"({config['text_steps']} training steps{test}) and on an "
        f"{config['denoiser_layers']}-layer Transformer denoiser for {config['video_frames']} "
        f"street-video frames, each method tuned{grid} on validation data and retrained from "
        f"{seeds} seed{'' if seeds == 1 else 's'}."
    )


SHIFT_VERDICTS = {
    "reproduced": "at least {gain} more accurate under {shifts} (reproduced)",
    "not reproduced": "not {gain} more accurate under {shifts} (not reproduced)",
    "inconclusive": "not shown either way under {shifts} (inconclusive)",
    "untested": "untested under {shifts}, since the constraints did not act",
}


def _robustness(payload: Mapping[str, Any]) -> Sentence:
    claims = claims_by_key(payload)
    labels = shift_labels(payload)
    verdicts = verdicts_of(payload, labels)
    bound, measured = binding(claims[CLEAN_PAPER_KEY])
    selected = strength(payload["data"]["text"]["selected"]["constrained"])
    effects = [float(claims[name]["effect"]) for name in labels]
    by_verdict = grouped(verdicts, labels)
    gain = f"{100 * float(claims[next(iter(labels))]['threshold']['value']):g} point"
    outcome = "; ".join(
        SHIFT_VERDICTS[v].format(gain=gain, shifts=listed(s)) for v, s in by_verdict.items()
    )
    counts = {len(gammas) for gammas in payload["data"]["text"]["levels"].values()}
    levels = (
        f"averaged over {counts.pop()} strengths of each shift" if len(counts) == 1 else "averaged"
    )
    if "reproduced" in by_verdict:
        advice = f"where you expect {listed(by_verdict['reproduced'])} at test time, try them"
    elif set(by_verdict) == {"untested"}:
        advice = "whether they help is unknown"
    elif "inconclusive" in by_verdict:
        advice = "no gain was resolved, and plain ERM remains the simpler choice at this scale"
    else:
        advice = (
            "at this scale the constraints bought no robustness, and plain ERM is the simpler "
            "choice"
        )
    return Sentence(
        f"On text the selected constraints ({selected}) {'did' if bound else 'barely'} bind "
        f"({measured}), and against ERM the constrained model's accuracy under shifted inputs "
        f"changed by {signed_points(min(effects))} to {signed_points(max(effects))} points ({levels}; the "
        f"claim, as tested: a gain of at least {gain}): it was {outcome}, so {advice}.",
        verdicts,
    )


CLEAN_VERDICTS = {
    "reproduced": "stays within {} (reproduced)",
    "not reproduced": "falls short of {} (not reproduced)",
    "inconclusive": "leaves {} inconclusive",
    "untested": "leaves {} untested, since the constraints did not act",
}


def _half_width(claim: Claim) -> float:
    low, high = claim["interval"]
    return float(high - low) / 2


def _seeds_needed(claim: Claim) -> int | None:
    """The seeds the seed-level interval would need to reach the claim's margin (stored with
    the claim since design 3; None before)."""
    found = claim.get("extra", {}).get("resolution")
    return None if found is None else found["seeds_needed"]


def _clean(payload: Mapping[str, Any]) -> Sentence:
    claims = claims_by_key(payload)
    paper = claims[CLEAN_PAPER_KEY]
    margins = {
        CLEAN_PAPER_KEY: f"the paper's {-100 * paper['threshold']['value']:.1g}-point margin",
        CLEAN_KEY: f"a {-100 * claims[CLEAN_KEY]['threshold']['value']:.1g}-point margin",
    }
    verdicts = verdicts_of(payload, margins)
    outcome = "; it ".join(
        CLEAN_VERDICTS[v].format(listed(m)) for v, m in grouped(verdicts, margins).items()
    )
    effect = float(paper["effect"])
    text = (
        f"Clean test accuracy was {abs(100 * effect):.1f} point "
        f"{'lower' if effect < 0 else 'higher'} with the constraints"
    )
    power = ""
    if paper["interval"] is not None:
        low, high = paper["interval"]
        over = " over test sentences and seeds" if "sentences" in paper["interval_method"] else ""
        text += f" (95 % interval{over} [{signed_points(low)}, {signed_points(high)}] points)"
        unresolved = [
            name
            for name in margins
            if claims[name]["interval"] is not None
            and _half_width(claims[name]) > -claims[name]["threshold"]["value"]
        ]
        if unresolved:
            half_width, needed = _half_width(paper), _seeds_needed(paper)
            sentences = test_sentences(payload["data"]["text"]["runs"])
            on = f" on {sentences:,} test sentences" if sentences else ""
            wider = listed([margins[name] for name in unresolved])
            seeds = (
                f" (at this seed-to-seed spread about {needed} seeds would narrow it to the "
                "paper's margin)"
                if needed and CLEAN_PAPER_KEY in unresolved
                else ""
            )
            power = (
                f"; that interval's half-width, {100 * half_width:.1f} points, is wider than "
                f"{wider}, so {paper['n']} seeds{on} cannot resolve a difference that "
                f"small{seeds}"
            )
    return Sentence(f"{text}, which {outcome}{power}.", verdicts)


MONOTONE_VERDICTS = {
    "reproduced": "On text, the constraints made per-layer losses fall layer by layer where "
    "ERM's did not (reproduced)",
    "not reproduced": "On text, the constraints did not make per-layer losses fall layer by "
    "layer where ERM's did not (not reproduced)",
    "inconclusive": "On text, whether the constraints make per-layer losses fall layer by layer "
    "where ERM's do not is inconclusive",
    "untested": "On text, whether the constraints make per-layer losses fall layer by layer "
    "where ERM's do not is untested",
}


def _video(payload: Mapping[str, Any]) -> Sentence:
    claims = claims_by_key(payload)
    labels = {
        VIDEO_NOISE_KEY: "lower error beyond the training noise",
        VIDEO_MONOTONE_KEY: "per-layer losses that fall layer by layer",
    }
    verdicts = verdicts_of(payload, labels)
    by_verdict = grouped(verdicts, labels)
    outcome = "; ".join(
        f"the claim of {found[0]} is {verdict}"
        if len(found) == 1
        else f"the claims of {listed([found[0], *(f'of {f}' for f in found[1:])])} are "
        f"{'both' if len(found) == 2 else 'all'} {verdict}"
        for verdict, found in by_verdict.items()
    )
    bound, measured = binding(claims[VIDEO_NOISE_KEY])
    video = payload["data"]["video"]["selected"]["constrained"]
    selected = strength(video)
    if bound:
        return Sentence(
            f"For the street-video denoiser the selected constraints ({selected}) bound "
            f"({measured}), and {outcome}.",
            verdicts,
        )
    ruled_out = _ruled_out(payload, "(b)")
    stronger = "the stronger " if ruled_out and min(ruled_out) > video["alpha"] else ""
    reason = (
        "by its error at the training noise"
        if payload["data"].get("design", 1) < 3
        else "by the selection rule"
    )
    excluded = (
        f"; {stronger}alpha = {listed([f'{a:g}' for a in ruled_out])} was ruled out in tuning "
        f"{reason}"
        if ruled_out
        else ""
    )
    return Sentence(
        f"For the street-video denoiser {outcome}: the selected constraints ({selected}) "
        f"barely bound ({measured}), so {what_ran(claims[VIDEO_NOISE_KEY])}{excluded}"
        f"{_revised_pick(payload)}; constraints act only while lambda is above zero, so check "
        "that share of steps before expecting any effect.",
        verdicts,
    )


def _revised_pick(payload: Mapping[str, Any]) -> str:
    """Where design 3's denoiser selection picks another point than the one the stored final
    runs trained (an earlier design's data), a clause naming it; else nothing."""
    data, video = payload["data"], payload["data"]["video"]
    grid = video.get("selection", {}).get("constrained")
    if data.get("design", 1) >= 3 or not grid:
        return ""
    index = selected_index(grid, denoising_score(grid, payload["config"]["clean_tolerance"]))
    if index is None or not constraints_act(grid[index]):
        return ""
    point = grid[index]
    if all(
        point[key] == video["selected"]["constrained"][key] for key in ("alpha", "resilient_cost")
    ):
        return ""
    cost = point["resilient_cost"]
    where = "hard" if cost is None else f"c = {cost:g}"
    return (
        " (design 3 selects among the points where the constraints act, here alpha = "
        f"{point['alpha']:g} at {where}, which only new seeds can test)"
    )


def _text_layers(payload: Mapping[str, Any]) -> Sentence:
    claim = claims_by_key(payload)[TEXT_MONOTONE_KEY]
    verdict = verdict_of(payload, TEXT_MONOTONE_KEY)
    text = MONOTONE_VERDICTS[verdict]
    bumps = check_named(claim, BUMP_CHECK)
    if verdict == "untested" and bumps["value"] is not None and not bumps["passed"]:
        seeds = int(claim["n"])
        smooth = seeds - round(float(bumps["value"]) * seeds)
        where = "every seed" if smooth == seeds else f"{smooth} of {seeds} seeds"
        text += (
            f": ERM's own per-layer losses already fell layer by layer in {where}, leaving no "
            "contrast to show"
        )
    elif verdict == "untested":
        text += f": {binding(claim)[1]}"
    return Sentence(text + ".", {TEXT_MONOTONE_KEY: verdict})


def _joined(first: Sentence, second: Sentence) -> Sentence:
    """Two sentences as one (the second's first letter lowered after a semicolon)."""
    text = first.text.rstrip(".") + "; " + second.text[0].lower() + second.text[1:]
    return Sentence(text, {**first.verdicts, **second.verdicts})


def summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The study's plain summary: what ran and at what scale, what the text results tell a
    user to do and at which constraint strength, and what stays unknown and why; with part
    (c)'s claims, the denoiser's and the text layers' sentences merge and part (c) ends it.

    Args:
        payload: the study's ``results.json`` object.

    Returns:
        Five sentences, each declaring the verdicts it states.
    """
    opening = [_scale(payload), _robustness(payload), _clean(payload)]
    if LANGUAGE_CLEAN_KEY not in claims_by_key(payload):
        return [*opening, _video(payload), _text_layers(payload)]
    return [*opening, _joined(_video(payload), _text_layers(payload)), language_sentence(payload)]
