"""The ``sparsity`` study's claims, from a ``results.json`` payload alone.

Every effect is one number per final seed, paired: HORST and its baseline trained from the
same seed, each at the configuration its own grid selected on validation.

1. At 90 % sparsity HORST's top-1 test accuracy is higher than AdamW's (AC/DC, ViT on
   Fashion-MNIST): effect acc_horst(90 %) - acc_adamw(90 %); holds if >= 0.
2. The same against HAM.
3. HORST loses at most half of AdamW's accuracy at 80-90 %: per seed
   drop_m = dense_m - mean over the targets >= 80 % of acc_m; effect
   drop_horst - 0.5 * drop_adamw; holds if <= 0.
4. HORST's weights concentrate near zero, measured scale-free: the share of the dense ViT's
   prunable weights below 1 % of their tensor's RMS; effect share_horst - share_adamw; holds
   if >= 0.
5. One-shot pruning of the character LM to the largest target costs HORST less: effect
   ppl_horst / ppl_adamw at that target (test windows); holds if <= 1.

Manipulation checks: HORST's mirror move relative to its AdamW move
(:func:`convergent.optim.horst_move_ratio`, mean over the recorded steps of each run behind the
claim, then over the runs) must be >= 0.2; AC/DC must reach its targets; and for claims 1 and
3 AdamW must lose at least 3 points from dense to 90 % (otherwise no optimizer has room to
help, and the claim is untested in this regime).

Only this design's payloads (``data["design"] == 2``) are scored; the results of earlier
designs, with the verdicts they were scored with, are data in
``docs/results/sparsity-full/history/``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.framework import (
    Check,
    Claim,
    at_least,
    at_most,
    check_design,
    claim_from_seeds,
    finite_mean,
    within,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.sparsity.config import sparsity_key

DESIGN = 2
HIGH_SPARSITY = 0.8  # claim 3 averages the AC/DC targets at or above this
HALF = 0.5
ROOM_REQUIRED = at_least(0.03)  # AdamW's dense-to-90 % loss that leaves room to help
MOVE_RATIO_REQUIRED = at_least(acting.MOVE_RATIO_FLOOR)
MOVE_RATIO_NOTE = (
    "below 0.2 the mirror step moves the weights less than a fifth as far as the AdamW step, "
    "so HORST is AdamW in all but name"
)
ACHIEVED_TOLERANCE = acting.SPARSITY_TOLERANCE  # AC/DC's top-k lands within a percent
DISPLAY = {"adamw": "AdamW", "ham": "HAM", "horst": "HORST"}


def _move_check(values: Sequence[Any], runs: str) -> Check:
    """The manipulation check from HORST's per-run move ratios (mean over the runs)."""
    ratios = [number(v) for v in values]
    finite = [v for v in ratios if math.isfinite(v)]
    spread = f"; runs range {min(finite):.4g} to {max(finite):.4g}" if finite else ""
    note = (
        f"{MOVE_RATIO_NOTE}. Mean over the recorded steps of each of {len(ratios)} HORST "
        f"run(s), then over the runs{spread}."
    )
    return Check(
        f"HORST mirror move / Adam move ({runs})", finite_mean(ratios), MOVE_RATIO_REQUIRED, note
    )


def _room_check(vision: Mapping[str, Any], key: str) -> Check:
    adamw = vision["accuracy"]["adamw"]
    drops = [number(d) - number(s) for d, s in zip(adamw["dense"], adamw[key], strict=True)]
    return Check(
        f"AdamW loses at least 3 points from dense to {key} (mean over seeds)",
        finite_mean(drops),
        ROOM_REQUIRED,
        "where AdamW barely loses accuracy no optimizer can show a smaller loss: the regime "
        "must leave the baseline room to fail",
    )


def _achieved_check(vision: Mapping[str, Any], keys: Sequence[str], names: Sequence[str]) -> Check:
    worst = max(
        abs(number(value) - float(key.rstrip("%")) / 100)
        for name in names
        for key in keys
        for value in vision["achieved"][name][key]
    )
    return Check(
        f"AC/DC reached its targets: largest |achieved - target| ({', '.join(keys)})",
        worst,
        within(0.0, ACHIEVED_TOLERANCE),
        "the final AC/DC models must be as sparse as the claim says",
    )


def _seeds(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.4f}" for v in values)


def _drops(by_key: Mapping[str, Sequence[Any]], keys: Sequence[str]) -> list[float]:
    return [
        number(dense) - statistics.fmean(number(by_key[key][i]) for key in keys)
        for i, dense in enumerate(by_key["dense"])
    ]


def claims_from_results(results: Mapping[str, Any]) -> list[Claim]:
    """The study's claims from ``results["config"]`` and ``results["data"]`` alone."""
    config, data = results["config"], results["data"]
    check_design("sparsity", data.get("design"), DESIGN)
    have = set(config["optimizers"])
    vision, language = data["vision"], data["language"]
    top = sparsity_key(max(config["sparsities"]))
    high = [sparsity_key(t) for t in config["sparsities"] if t >= HIGH_SPARSITY - 1e-9]
    claims: list[Claim] = []
    if "horst" not in have:
        return claims
    accuracy, moves = vision["accuracy"], vision["move_ratio"]["horst"]
    horst_top = [number(v) for v in accuracy["horst"][top]]
    for baseline in ("adamw", "ham"):
        if baseline not in have:
            continue
        other = [number(v) for v in accuracy[baseline][top]]
        checks = [
            _move_check(moves[top], f"ViT, AC/DC at {top}, every seed"),
            _achieved_check(vision, [top], ["horst", baseline]),
        ]
        if baseline == "adamw":
            checks.append(_room_check(vision, top))
        shown = DISPLAY[baseline]
        claims.append(
            claim_from_seeds(
                f"At {top} sparsity HORST reaches a higher top-1 accuracy than {shown} (AC/DC, "
                "ViT on Fashion-MNIST, each at its own selected configuration)",
                [h - o for h, o in zip(horst_top, other, strict=True)],
                at_least(0.0),
                unit=f"top-1 test accuracy at {top}, HORST minus {shown} (fraction)",
                checks=checks,
                evidence=(
                    f"top-1 at {top} per seed: HORST {_seeds(horst_top)}; {shown} {_seeds(other)}."
                ),
                paired=True,
            )
        )
    if "adamw" in have and high:
        horst, adamw = _drops(accuracy["horst"], high), _drops(accuracy["adamw"], high)
        claims.append(
            claim_from_seeds(
                f"At {'-'.join(high)} sparsity HORST loses at most half the top-1 accuracy "
                "AdamW loses from dense",
                [h - HALF * a for h, a in zip(horst, adamw, strict=True)],
                at_most(0.0),
                unit="accuracy lost by HORST minus half that lost by AdamW (fraction)",
                checks=[
                    _move_check([v for key in high for v in moves[key]], "ViT, AC/DC, every seed"),
                    _achieved_check(vision, high, ["horst", "adamw"]),
                    _room_check(vision, top),
                ],
                evidence=(
                    f"accuracy lost from dense (mean over {', '.join(high)}) per seed: HORST "
                    f"{_seeds(horst)}; AdamW {_seeds(adamw)}."
                ),
                paired=True,
            )
        )
        share = vision["near_zero_share"]
        horst_share = [number(v) for v in share["horst"]]
        adamw_share = [number(v) for v in share["adamw"]]
        fraction = number(data["rms_fraction"])
        claims.append(
            claim_from_seeds(
                f"HORST's weights concentrate near zero: a larger share of the dense ViT's "
                f"prunable weights lies below {fraction:g} x their tensor's RMS than AdamW's",
                [h - a for h, a in zip(horst_share, adamw_share, strict=True)],
                at_least(0.0),
                unit=f"share of weights below {fraction:g} x RMS, HORST minus AdamW",
                checks=[_move_check(moves["dense"], "dense ViT, every seed")],
                evidence=(
                    f"share per seed: HORST {_seeds(horst_share)}; AdamW {_seeds(adamw_share)}"
                    f" (a Gaussian tensor: {math.erf(fraction / math.sqrt(2)):.4f})."
                ),
                paired=True,
            )
        )
    if {"adamw", "horst"} <= set(config["lm_optimizers"]):
        claims.append(_language_claim(config, language))
    return claims


def _language_claim(config: Mapping[str, Any], language: Mapping[str, Any]) -> Claim:
    key = sparsity_key(max(config["lm_sparsities"]))
    horst = [number(v) for v in language["perplexity"]["horst"][key]]
    adamw = [number(v) for v in language["perplexity"]["adamw"][key]]
    return claim_from_seeds(
        f"One-shot magnitude pruning to {key}: a HORST-trained character LM keeps a lower "
        "perplexity than an AdamW-trained one (ratio HORST / AdamW)",
        [h / a for h, a in zip(horst, adamw, strict=True)],
        at_most(1.0),
        unit=f"test perplexity at {key}, HORST over AdamW",
        checks=[_move_check(language["move_ratio"]["horst"], "dense LMs, every seed")],
        evidence=f"test perplexity at {key} per seed: HORST {_seeds(horst)}; AdamW {_seeds(adamw)}.",
        paired=True,
    )
