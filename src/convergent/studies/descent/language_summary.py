"""Part (c) of the ``descent`` study's summary: the language model's two win rates and its
per-layer claim, with the constraint strength that ran and what a user fine-tuning a language
model should do with them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convergent.studies.descent.checks import (
    BUMP_CHECK,
    LANGUAGE_CLEAN_KEY,
    LANGUAGE_MONOTONE_KEY,
    LANGUAGE_NOISE_KEY,
)
from convergent.studies.descent.config import LANGUAGE_CLAIM_GAMMA
from convergent.studies.descent.language_claims import ERM_FIT_CHECK, PAPER_NOISY_WIN
from convergent.studies.descent.wording import Claim, binding, check_named, percent, strength
from convergent.studies.framework import Sentence, claims_by_key, verdicts_of

PAPER_NOISY = f"{100 * PAPER_NOISY_WIN:.2f} %"  # the paper's win rate under noise


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


# What part (c) advises where its noisy win rate did not reproduce, by that claim's verdict.
NOISE_ADVICE = {
    "not reproduced": "; at this scale the constraints' win rate under embedding noise stayed "
    "below the test's {floor}, so plain fine-tuning remains the simpler choice",
    "inconclusive": "; whether the constraints make a fine-tuned language model more robust to "
    "embedding noise stays open at this scale",
    "untested": "",
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
    return NOISE_ADVICE[noise].format(floor=floor)


def _share(claim: Claim) -> str:
    """A win-rate claim's effect as a percentage (n/a when every seed diverged)."""
    return "n/a" if claim["effect"] is None else percent(float(claim["effect"]))


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
        percent(shares[0])
        if percent(min(shares)) == percent(max(shares))
        else f"{percent(min(shares))} to {percent(max(shares))}"
    )
    return (
        "; for a language-model fine-tune this leaves the paper's robustness claim open at this "
        f"scale: some lambda was positive in {spread} of the steps across seeds, so read that "
        "share (`fit` logs it) before crediting the constraints with any gain"
    )


def language_sentence(payload: Mapping[str, Any]) -> Sentence:
    """Part (c): the two win rates and the per-layer claim, with the strength that ran."""
    claims = claims_by_key(payload)
    names = (LANGUAGE_CLEAN_KEY, LANGUAGE_NOISE_KEY, LANGUAGE_MONOTONE_KEY)
    verdicts = verdicts_of(payload, names)
    clean, noise, layers = (claims[name] for name in names)
    spec = payload["config"]["language"]
    bound, measured = binding(noise)
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
    fit = check_named(clean, ERM_FIT_CHECK)
    why = (
        ", since ERM's own fine-tune did not improve on its start"
        if fit["passed"] is not True
        else ""
    )
    floor = percent(float(noise["threshold"]["value"]))
    layer_text = LANGUAGE_LAYERS[verdicts[LANGUAGE_MONOTONE_KEY]]
    bumps = check_named(layers, BUMP_CHECK)
    if verdicts[LANGUAGE_MONOTONE_KEY] == "untested" and bumps["passed"] is False:
        layer_text += " (ERM's own already fell layer by layer)"
    selected = strength(payload["data"]["language"]["selected"]["constrained"])
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
