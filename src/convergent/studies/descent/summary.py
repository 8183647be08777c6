"""The plain summary of the ``descent`` study: what a user can take from its verdicts.

Every sentence is written from a ``results.json`` payload: the verdicts (`verdict_of`), the
claims' effects, intervals and manipulation checks, the selected points (``data``) and the
tuning grids, so a rescored or re-run result rewrites its own summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from convergent.studies.descent.claims import (
    CLEAN_KEY,
    CLEAN_PAPER_KEY,
    LANGUAGE_CLEAN_KEY,
    LANGUAGE_MONOTONE_KEY,
    LANGUAGE_NOISE_KEY,
    PAPER_NOISY_WIN,
    TEXT_MONOTONE_KEY,
    VIDEO_MONOTONE_KEY,
    VIDEO_NOISE_KEY,
    robustness_key,
)
from convergent.studies.descent.config import LANGUAGE_CLAIM_GAMMA
from convergent.studies.descent.selection import (
    constraints_act,
    denoising_score,
    selected_index,
)
from convergent.studies.framework import Sentence, claims_by_key, verdict_of

# Each perturbation kind (a key of ``data.text.levels``) in a user's words.
SHIFTS = {
    "gaussian": "Gaussian embedding noise",
    "uniform": "uniform embedding noise",
    "discrete": "random token swaps",
    "typos": "typos",
    "word_dropout": "word dropout",
}
PAPER_NOISY = f"{100 * PAPER_NOISY_WIN:.2f} %"  # the paper's win rate under noise
# The manipulation checks that say whether the constraints bound, by how their names start.
PEAK_CHECK = "largest multiplier"
ACTIVE_CHECK = "share of training steps"
BUMP_CHECK = "share of ERM seeds"
MAX_TEST_SIZE = 100_000  # accuracies are read as exact shares of a test set at most this large

Claim = Mapping[str, Any]


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _points(value: float) -> str:
    """An accuracy difference (a fraction) in signed percentage points."""
    return f"{100 * value:+.1f}"


def _percent(value: float) -> str:
    return f"{100 * value:.0f} %"


def _short_of(value: float, floor: float, digits: int) -> str:
    """A value that missed ``floor``, with ``digits`` more significant digits (``.Ng``; for
    ``digits`` 0, whole numbers) until it no longer prints as the floor: 0.0996 against 0.1
    reads 0.0996, not 0.1."""
    for extra in range(digits, digits + 6):
        text = f"{value:.{extra}f}" if digits == 0 else f"{value:.{extra + 1}g}"
        if float(text) != floor:
            return text
    return f"{value:g}"


def _floor(check: Mapping[str, Any]) -> float:
    """The number in a check's requirement (``">= 0.1"`` gives 0.1)."""
    return float(str(check["required"]).split()[-1])


def _check(claim: Claim, start: str) -> Mapping[str, Any]:
    return next(check for check in claim["checks"] if check["name"].startswith(start))


def _strength(point: Mapping[str, Any]) -> str:
    """A selected constrained point in a user's terms."""
    cost = point["resilient_cost"]
    slack = "hard, no slack" if cost is None else f"slack allowed at cost c = {cost:g}"
    return (
        f"alpha = {point['alpha']:g}, each layer to cut the loss by {_percent(point['alpha'])}; "
        f"{slack}"
    )


def _binding(claim: Claim) -> tuple[bool, str]:
    """Whether the constraints bound in every seed (the claim's manipulation checks), and the
    measured multiplier and active share in words."""
    peak, active = _check(claim, PEAK_CHECK), _check(claim, ACTIVE_CHECK)
    if peak["value"] is None or active["value"] is None:
        return False, "a seed recorded no multiplier"
    if peak["passed"] and active["passed"]:
        steps = (
            "every training step"
            if active["value"] >= 1
            else f"at least {_percent(active['value'])} of training steps"
        )
        return True, (
            f"lambda reached at least {peak['value']:.2g} in every seed, and some lambda was "
            f"positive in {steps}"
        )
    low_peak = (
        f"the largest lambda was as low as {_short_of(peak['value'], _floor(peak), 1)}, where "
        f"the check needs {_floor(peak):g}"
    )
    few_steps = (
        "some lambda was positive in as few as "
        f"{_short_of(100 * active['value'], 100 * _floor(active), 0)} % of training steps, "
        f"where the check needs {_percent(_floor(active))}"
    )
    if not peak["passed"] and not active["passed"]:
        return False, f"{low_peak}, and {few_steps}"
    if not peak["passed"]:  # name the passed check as passed, not as a reason
        return False, f"{low_peak}, though some lambda was positive in at least " + (
            f"{_percent(active['value'])} of training steps"
        )
    return False, f"lambda reached at least {peak['value']:.2g} in every seed, but {few_steps}"


def _what_ran(claim: Claim) -> str:
    """What unbound constrained runs were: ERM in all but name when both binding checks failed;
    when one passed, runs the declared check does not count as constrained."""
    peak, active = _check(claim, PEAK_CHECK), _check(claim, ACTIVE_CHECK)
    if peak["value"] is None or active["value"] is None:
        return "the declared check cannot count those runs as constrained training"
    if not peak["passed"] and not active["passed"]:
        return "those runs were ERM in all but name"
    return "the declared check does not count those runs as constrained training"


def _test_sentences(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> int | None:
    """The test-set size behind the clean accuracies (each a share of the same test set, so
    their common denominator), or None when they are not exact shares of one."""
    accuracies = [float(record["clean"]) for records in runs.values() for record in records]
    shares = [Fraction(value).limit_denominator(MAX_TEST_SIZE) for value in accuracies]
    if not shares or any(abs(s - a) > 1e-12 for s, a in zip(shares, accuracies, strict=True)):
        return None
    size = math.lcm(*(share.denominator for share in shares))
    return size if 1 < size <= MAX_TEST_SIZE else None


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
    sentences = _test_sentences(data["text"]["runs"])
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
    kinds = list(payload["data"]["text"]["levels"])
    names = [robustness_key(kind) for kind in kinds]
    verdicts = {name: verdict_of(payload, name) for name in names}
    bound, measured = _binding(claims[CLEAN_PAPER_KEY])
    selected = _strength(payload["data"]["text"]["selected"]["constrained"])
    effects = [float(claims[name]["effect"]) for name in names]
    by_verdict: dict[str, list[str]] = {}
    for kind, name in zip(kinds, names, strict=True):
        by_verdict.setdefault(verdicts[name], []).append(SHIFTS.get(kind, kind.replace("_", " ")))
    gain = f"{100 * float(claims[names[0]]['threshold']['value']):g} point"
    outcome = "; ".join(
        SHIFT_VERDICTS[v].format(gain=gain, shifts=_join(s)) for v, s in by_verdict.items()
    )
    counts = {len(gammas) for gammas in payload["data"]["text"]["levels"].values()}
    levels = (
        f"averaged over {counts.pop()} strengths of each shift" if len(counts) == 1 else "averaged"
    )
    if "reproduced" in by_verdict:
        advice = f"where you expect {_join(by_verdict['reproduced'])} at test time, try them"
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
        f"changed by {_points(min(effects))} to {_points(max(effects))} points ({levels}; the "
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
    verdicts = {name: verdict_of(payload, name) for name in margins}
    by_verdict: dict[str, list[str]] = {}
    for name, margin in margins.items():
        by_verdict.setdefault(verdicts[name], []).append(margin)
    outcome = "; it ".join(CLEAN_VERDICTS[v].format(_join(m)) for v, m in by_verdict.items())
    effect = float(paper["effect"])
    text = (
        f"Clean test accuracy was {abs(100 * effect):.1f} point "
        f"{'lower' if effect < 0 else 'higher'} with the constraints"
    )
    power = ""
    if paper["interval"] is not None:
        low, high = paper["interval"]
        over = " over test sentences and seeds" if "sentences" in paper["interval_method"] else ""
        text += f" (95 % interval{over} [{_points(low)}, {_points(high)}] points)"
        unresolved = [
            name
            for name in margins
            if claims[name]["interval"] is not None
            and _half_width(claims[name]) > -claims[name]["threshold"]["value"]
        ]
        if unresolved:
            half_width, needed = _half_width(paper), _seeds_needed(paper)
            sentences = _test_sentences(payload["data"]["text"]["runs"])
            on = f" on {sentences:,} test sentences" if sentences else ""
            wider = _join([margins[name] for name in unresolved])
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
    verdicts = {name: verdict_of(payload, name) for name in labels}
    by_verdict: dict[str, list[str]] = {}
    for name, label in labels.items():
        by_verdict.setdefault(verdicts[name], []).append(label)
    outcome = "; ".join(
        f"the claim of {found[0]} is {verdict}"
        if len(found) == 1
        else f"the claims of {_join([found[0], *(f'of {f}' for f in found[1:])])} are "
        f"{'both' if len(found) == 2 else 'all'} {verdict}"
        for verdict, found in by_verdict.items()
    )
    bound, measured = _binding(claims[VIDEO_NOISE_KEY])
    video = payload["data"]["video"]["selected"]["constrained"]
    selected = _strength(video)
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
        f"; {stronger}alpha = {_join([f'{a:g}' for a in ruled_out])} was ruled out in tuning "
        f"{reason}"
        if ruled_out
        else ""
    )
    return Sentence(
        f"For the street-video denoiser {outcome}: the selected constraints ({selected}) "
        f"barely bound ({measured}), so {_what_ran(claims[VIDEO_NOISE_KEY])}{excluded}"
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
    bumps = _check(claim, BUMP_CHECK)
    if verdict == "untested" and bumps["value"] is not None and not bumps["passed"]:
        seeds = int(claim["n"])
        smooth = seeds - round(float(bumps["value"]) * seeds)
        where = "every seed" if smooth == seeds else f"{smooth} of {seeds} seeds"
        text += (
            f": ERM's own per-layer losses already fell layer by layer in {where}, leaving no "
            "contrast to show"
        )
    elif verdict == "untested":
        text += f": {_binding(claim)[1]}"
    return Sentence(text + ".", {TEXT_MONOTONE_KEY: verdict})


CLEAN_WIN = {
    "reproduced": "within {margin} points of the paper's 50 % (reproduced)",
    "not reproduced": "more than {margin} points from the paper's 50 % (not reproduced)",
    "inconclusive": "not resolved against the paper's 50 % +- {margin} points (inconclusive)",
    "untested": "leaving the paper's 50 % untested{why}",
}
NOISE_WIN = {
    "reproduced": "clearing the test's {floor} (reproduced; the paper: {paper})",
    "not reproduced": "short of the test's {floor} (not reproduced; the paper: {paper})",
    "inconclusive": "not resolved against the test's {floor} (inconclusive; the paper: {paper})",
    "untested": "leaving the paper's {paper} untested",
}
LANGUAGE_LAYERS = {
    "reproduced": "its per-layer losses fell layer by layer where ERM's did not (reproduced)",
    "not reproduced": "its per-layer losses did not fall layer by layer where ERM's did not "
    "(not reproduced)",
    "inconclusive": "whether its per-layer losses fall layer by layer where ERM's do not is "
    "inconclusive",
    "untested": "whether its per-layer losses fall layer by layer where ERM's do not is untested",
}


def _language_advice(
    noise: str, clean: str, clean_effect: float | None, margin: str, floor: str
) -> str:
    """What part (c) tells a user who fine-tunes a language model, from the noisy and clean
    win-rate verdicts (declared before part (c)'s full run); the clean claim is two-sided, so
    its "not reproduced" reads by the side its win rate fell on."""
    if noise == "reproduced":
        if clean == "reproduced":
            return (
                "; for a language model whose inputs may be noisy, constrained fine-tuning at "
                f"this strength is worth trying: without noise it cost no more than {margin} "
                "points of win rate"
            )
        if clean == "not reproduced" and clean_effect is not None and clean_effect < 0.5:
            return (
                "; constrained fine-tuning helped under noise but lost without it, so use it "
                "only where inputs are noisy"
            )
        return "; where inputs are noisy, constrained fine-tuning is worth trying"
    if noise == "not reproduced":
        return (
            f"; at this scale the constraints' win rate under embedding noise stayed below the "
            f"test's {floor}, so plain fine-tuning remains the simpler choice"
        )
    if noise == "inconclusive":
        return (
            "; whether the constraints make a fine-tuned language model more robust to "
            "embedding noise stays open at this scale"
        )
    return ""


def _share(claim: Claim) -> str:
    """A win-rate claim's effect as a percentage (n/a when every seed diverged)."""
    return "n/a" if claim["effect"] is None else _percent(float(claim["effect"]))


def _share_interval(claim: Claim) -> str:
    """A win-rate claim's interval in percent, after a space (nothing when it has none)."""
    if claim["interval"] is None:
        return ""
    low, high = claim["interval"]
    return f" [{100 * low:.0f}, {100 * high:.0f}]"


def _open_for_language(payload: Mapping[str, Any]) -> str:
    """What unbound part (c) runs leave a language-model user: the claim open, and the measured
    range of the constrained runs' active share to read in their own runs (nothing when no
    run recorded one)."""
    shares = [
        float(record["multiplier_active_share"])
        for record in payload["data"]["language"]["runs"]["constrained"]
        if record.get("multiplier_active_share") is not None
    ]
    if not shares:
        return ""
    spread = (
        _percent(shares[0])
        if _percent(min(shares)) == _percent(max(shares))
        else f"{_percent(min(shares))} to {_percent(max(shares))}"
    )
    return (
        "; for a language-model fine-tune this leaves the paper's robustness claim open at this "
        f"scale: some lambda was positive in {spread} of the steps across seeds, so read that "
        "share (`fit` logs it) before crediting the constraints with any gain"
    )


def _language(payload: Mapping[str, Any]) -> Sentence:
    """Part (c): the two win rates and the per-layer claim, with the strength that ran."""
    claims = claims_by_key(payload)
    names = (LANGUAGE_CLEAN_KEY, LANGUAGE_NOISE_KEY, LANGUAGE_MONOTONE_KEY)
    verdicts = {name: verdict_of(payload, name) for name in names}
    clean, noise, layers = (claims[name] for name in names)
    spec = payload["config"]["language"]
    bound, measured = _binding(noise)
    model = (
        f"On a {spec['layers']}-layer GPT-style language model pretrained on Jane Austen's "
        f"novels and fine-tuned on held-apart text ({clean['n']} seed"
        f"{'' if clean['n'] == 1 else 's'})"
    )
    if not bound:
        return Sentence(
            f"{model} the selected constraints barely bound ({measured}), so its three "
            f"claims are untested; measured anyway, the constrained model won {_share(clean)} "
            f"of the test windows against ERM without noise and {_share(noise)}"
            f"{_share_interval(noise)} under Gaussian embedding noise at gamma "
            f"{LANGUAGE_CLAIM_GAMMA:g} (the paper: {PAPER_NOISY}), which this design cannot count as the constraints' effect"
            f"{_open_for_language(payload)}.",
            verdicts,
        )
    low, high = clean["threshold"]["value"]
    margin = f"{100 * (high - low) / 2:g}"
    fit = _check(clean, "ERM's clean test perplexity")
    why = (
        ", since ERM's own fine-tune did not improve on its start"
        if fit["passed"] is not True
        else ""
    )
    floor = _percent(float(noise["threshold"]["value"]))
    layer_text = LANGUAGE_LAYERS[verdicts[LANGUAGE_MONOTONE_KEY]]
    bumps = _check(layers, BUMP_CHECK)
    if verdicts[LANGUAGE_MONOTONE_KEY] == "untested" and bumps["passed"] is False:
        layer_text += " (ERM's own already fell layer by layer)"
    selected = _strength(payload["data"]["language"]["selected"]["constrained"])
    effect = None if clean["effect"] is None else float(clean["effect"])
    advice = _language_advice(
        verdicts[LANGUAGE_NOISE_KEY], verdicts[LANGUAGE_CLEAN_KEY], effect, margin, floor
    )
    return Sentence(
        f"{model} the selected constraints ({selected}) bound ({measured}); the constrained "
        f"model won {_share(clean)} of the test windows against ERM without "
        f"noise, {CLEAN_WIN[verdicts[LANGUAGE_CLEAN_KEY]].format(margin=margin, why=why)}, and "
        f"{_share(noise)} under Gaussian embedding noise at gamma {LANGUAGE_CLAIM_GAMMA:g}, "
        f"{NOISE_WIN[verdicts[LANGUAGE_NOISE_KEY]].format(floor=floor, paper=PAPER_NOISY)}, and {layer_text}{advice}.",
        verdicts,
    )


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
    return [*opening, _joined(_video(payload), _text_layers(payload)), _language(payload)]
