"""The ``sparsity`` study's claims, from a ``results.json`` payload alone.

Every effect is one number per final seed, paired: HORST and its baseline trained from the
same seed, each at the configuration its own grid selected on validation.

1. At 90 % sparsity HORST's top-1 test accuracy is higher than AdamW's (AC/DC, ViT on
   Fashion-MNIST): effect acc_horst(90 %) - acc_adamw(90 %); holds if >= 0.
2. The same against HAM.
3. HORST loses at most half of AdamW's accuracy at 80-90 %: per seed
   drop_m = dense_m - mean over the targets >= 80 % of acc_m; effect
   drop_horst - 0.5 * drop_adamw; holds if <= 0.
4. HORST's weights concentrate near zero, measured scale-free: the share of the dense model's
   prunable weights below 1 % of their tensor's RMS; effect share_horst - share_adamw; holds
   if >= 0. Two claims: the ViT's dense final runs and the character LM's final runs.
5. One-shot pruning of the character LM costs HORST less: for each pruner of
   ``lm_pruners`` (magnitude, Wanda, SparseGPT) and each target of :data:`LM_TARGETS` that was
   run, effect ppl_horst / ppl_adamw (test windows); holds if <= 1.
   The SparseGPT-70 % claim also carries "HORST's advantage survives a pruner that updates the
   kept weights": design 3 scored that as a claim of its own with the same per-seed values
   (one result counted twice; STUDIES.md rule 14), design 4 writes it into this claim's text.
6. Part (c), a HORST fine-tune of pretrained MiniLM-L6 against an AdamW one, pruned one-shot:
   :mod:`.finetune_config` (scored where the data holds part (c)).

Manipulation checks: HORST's mirror move relative to its AdamW move
(:func:`convergent.optim.horst_move_ratio`, mean over the recorded steps of each run behind the
claim, then over the runs) must be >= 0.2, and for claim 2 HAM's the same
(:func:`convergent.optim.ham_move_ratio`); AC/DC must reach its targets; for claims 1 and 3
AdamW, and for claim 2 HAM, must lose at least 3 points from dense to 90 % (otherwise no
optimizer has room to help, and the claim is untested in this regime). Every LM claim also
checks that each optimizer's selected LM passed the selection's dense-quality floor (its dense
validation perplexity at most ``LM_DENSE_TOLERANCE`` x the best over every grid): where no
point passes, the selection falls back to the grid's first point, which nothing chose.

Only this design's payloads (``data["design"] == 4``) are scored; the results of earlier
designs, with the verdicts they were scored with, are data in
``docs/results/sparsity-full/history/``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.studies.engine import ClaimSpec
from convergent.studies.framework import (
    Check,
    Claim,
    at_least,
    at_most,
    check_design,
    family_tested,
    finite_mean,
    not_measured,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.sparsity.checks import (
    ACHIEVED,
    DISPLAY,
    FLOOR,
    MOVE,
    PRUNER_NAMES,
    ROOM,
)
from convergent.studies.sparsity.config import LM_SELECTION_PRUNER, sparsity_key
from convergent.studies.sparsity.finetune_runs import finetune_claims
from convergent.studies.sparsity.selection import is_point

DESIGN = 4
HIGH_SPARSITY = 0.8  # claim 3 averages the AC/DC targets at or above this
HALF = 0.5
LM_TARGETS = (0.7, 0.9)  # the one-shot targets the LM claims read (those that were run)
STRONGER_PRUNER, STRONGER_TARGET = "sparsegpt", 0.7  # the claim that says "survives"


def _move_check(values: Sequence[Any], runs: str, method: str = "horst") -> Check:
    """The manipulation check from HORST's (or HAM's) per-run move ratios (mean over runs)."""
    ratios = [number(v) for v in values]
    finite = [v for v in ratios if math.isfinite(v)]
    spread = f"; runs range {min(finite):.4g} to {max(finite):.4g}" if finite else ""
    fields = {"shown": DISPLAY[method], "runs": runs, "count": len(ratios), "spread": spread}
    return MOVE.check(finite_mean(ratios), **fields)


def _room_check(vision: Mapping[str, Any], key: str, name: str = "adamw") -> Check:
    """``name`` must lose at least 3 points from dense to ``key`` (mean over the seeds)."""
    by_key = vision["accuracy"][name]
    drops = [number(d) - number(s) for d, s in zip(by_key["dense"], by_key[key], strict=True)]
    return ROOM.check(finite_mean(drops), shown=DISPLAY[name], key=key)


def _achieved_check(vision: Mapping[str, Any], keys: Sequence[str], names: Sequence[str]) -> Check:
    worst = max(
        abs(number(value) - float(key.rstrip("%")) / 100)
        for name in names
        for key in keys
        for value in vision["achieved"][name][key]
    )
    return ACHIEVED.check(worst, keys=", ".join(keys))


BEATS = ClaimSpec(
    "sparsity.horst_beats_{baseline}_acdc_{tag}",
    "At {top} sparsity HORST reaches a higher top-1 accuracy than {shown} (here: AC/DC, ViT on "
    "Fashion-MNIST, each at its own selected configuration, test top-1 HORST minus {shown} "
    "paired per seed)",
    at_least(0.0),
    "top-1 test accuracy at {top}, HORST minus {shown} (fraction)",
    "top-1 at {top} per seed: HORST {horst}; {shown} {other}.",
    "{revised}",
    paired=True,
)
HAM_REVISED = (
    "design 3: untested unless HAM's own mirror step acts (move ratio >= 0.2) and HAM loses at "
    "least 3 points from dense to {top}, as AdamW must for the AdamW comparison"
)
HALF_LOSS = ClaimSpec(
    "sparsity.horst_loses_half_of_adamw_acdc_{tags}",
    "At {joined} sparsity HORST loses at most half the top-1 accuracy AdamW loses from dense "
    "(here: AC/DC, ViT on Fashion-MNIST, per seed the accuracy lost from dense averaged over "
    "{listed}, HORST's minus half of AdamW's)",
    at_most(0.0),
    "accuracy lost by HORST minus half that lost by AdamW (fraction)",
    "accuracy lost from dense (mean over {listed}) per seed: HORST {horst}; AdamW {adamw}.",
    paired=True,
)
NEAR_ZERO = ClaimSpec(
    "sparsity.horst_near_zero_{model_tag}",
    "HORST's weights concentrate near zero in the {model} (here: a larger share of {weights} "
    "lies below {fraction:g} x their tensor's RMS than AdamW's, paired per seed)",
    at_least(0.0),
    "share of weights below {fraction:g} x RMS, HORST minus AdamW",
    "share per seed: HORST {horst}; AdamW {adamw} (a Gaussian tensor: {gaussian:.4f}).",
    "{revised}",
    paired=True,
)
ONE_SHOT = ClaimSpec(
    "sparsity.horst_lower_perplexity_{pruner}_{tag}",
    "One-shot {shown} pruning to {key}: a HORST-trained character LM keeps a lower perplexity "
    "than an AdamW-trained one (here: test perplexity after one-shot {shown} pruning to {key}, "
    "HORST over AdamW paired per seed, each at the configuration selected on validation after "
    "magnitude pruning to {selection}{calibrated}{survives})",
    at_most(1.0),
    "test perplexity after {shown} to {key}, HORST over AdamW",
    "test perplexity after {shown} to {key} per seed: HORST {horst}; AdamW {adamw} (dense: "
    "HORST {dense_horst}; AdamW {dense_adamw}).",
    "{revised}",
    paired=True,
)
SURVIVES = (
    "; this is also the test of whether HORST's advantage survives a pruner that updates the "
    "kept weights"
)
ONE_SHOT_REVISED = {
    "stronger": "design 4: the claim design 3 scored separately as 'HORST's advantage survives "
    "a stronger pruner' (the same per-seed values) is written into this one",
    "selection": "",
    "other": "design 3: new, another pruner or target than magnitude at the largest",
}


def target_tag(label: str) -> str:
    """A sparsity label in a claim key: ``"70%" -> "70"`` (``"87.5%" -> "87p5"``)."""
    return label.rstrip("%").replace(".", "p")


def vision_key(baseline: str, label: str) -> str:
    """The key of the AC/DC claim that HORST beats ``baseline`` at sparsity ``label``."""
    return BEATS.key.format(baseline=baseline, tag=target_tag(label))


def half_loss_key(labels: Sequence[str]) -> str:
    """The key of the AC/DC claim that HORST loses at most half of AdamW's accuracy loss."""
    return HALF_LOSS.key.format(tags="_".join(map(target_tag, labels)))


def near_zero_key(model: str) -> str:
    """The key of the claim that HORST's weights concentrate near zero in ``model``."""
    return NEAR_ZERO.key.format(model_tag=model.lower().replace("character ", "char_"))


def pruned_key(pruner: str, label: str) -> str:
    """The key of the one-shot claim after ``pruner`` to ``label``."""
    return ONE_SHOT.key.format(pruner=pruner, tag=target_tag(label))


def _seeds(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.4f}" for v in values)


def _numbers(values: Sequence[Any]) -> list[float]:
    return [number(v) for v in values]


def _drops(by_key: Mapping[str, Sequence[Any]], keys: Sequence[str]) -> list[float]:
    return [
        number(dense) - statistics.fmean(number(by_key[key][i]) for key in keys)
        for i, dense in enumerate(by_key["dense"])
    ]


# The study's parts, each one family of claims tested together (Holm: framework/family.py).
FAMILIES: Mapping[str, str] = {
    "sparsity.horst_beats_": "(a) ViT under AC/DC",
    "sparsity.horst_loses_": "(a) ViT under AC/DC",
    "sparsity.horst_near_zero_vit": "(a) ViT under AC/DC",
    "sparsity.horst_near_zero_char_lm": "(b) character LM, one-shot pruning",
    "sparsity.horst_near_zero_lm": "(b) character LM, one-shot pruning",
    "sparsity.horst_lower_perplexity_": "(b) character LM, one-shot pruning",
    "sparsity.horst_oneshot_": "(b) character LM, one-shot pruning",
    "sparsity.horst_survives_": "(b) character LM, one-shot pruning",
    "sparsity.finetune_": "(c) MiniLM fine-tune, then one-shot pruning",
}


def claims_from_results(results: Mapping[str, Any]) -> list[Claim]:
    """The study's claims from ``results["config"]`` and ``results["data"]`` alone."""
    config, data = results["config"], results["data"]
    check_design("sparsity", data.get("design"), DESIGN)
    claims: list[Claim] = []
    if "horst" in config["optimizers"]:
        claims.extend(_vision_claims(config, data))
    if {"adamw", "horst"} <= set(config["lm_optimizers"]):
        claims.extend(_language_claims(config, data))
    if "finetune" in data:
        claims.extend(finetune_claims(data["finetune"]))
    return family_tested(claims, FAMILIES)


def _vision_claims(config: Mapping[str, Any], data: Mapping[str, Any]) -> list[Claim]:
    have = set(config["optimizers"])
    vision = data["vision"]
    top = sparsity_key(max(config["sparsities"]))
    high = [sparsity_key(t) for t in config["sparsities"] if t >= HIGH_SPARSITY - 1e-9]
    accuracy, moves = vision["accuracy"], vision["move_ratio"]
    horst_top = _numbers(accuracy["horst"][top])
    claims: list[Claim] = []
    for baseline in ("adamw", "ham"):
        if baseline not in have:
            continue
        other = _numbers(accuracy[baseline][top])
        checks = [_move_check(moves["horst"][top], f"ViT, AC/DC at {top}, every seed")]
        if baseline == "ham":
            checks.append(_move_check(moves["ham"][top], f"ViT, AC/DC at {top}, every seed", "ham"))
        checks += [
            _achieved_check(vision, [top], ["horst", baseline]),
            _room_check(vision, top, baseline),
        ]
        claims.append(
            BEATS.claim(
                [h - o for h, o in zip(horst_top, other, strict=True)],
                checks,
                baseline=baseline,
                tag=target_tag(top),
                top=top,
                shown=DISPLAY[baseline],
                horst=_seeds(horst_top),
                other=_seeds(other),
                revised=HAM_REVISED.format(top=top) if baseline == "ham" else "",
            )
        )
    if "adamw" in have and high:
        horst, adamw = _drops(accuracy["horst"], high), _drops(accuracy["adamw"], high)
        checks = [
            _move_check([v for key in high for v in moves["horst"][key]], "ViT, AC/DC, every seed"),
            _achieved_check(vision, high, ["horst", "adamw"]),
            _room_check(vision, top),
        ]
        claims.append(
            HALF_LOSS.claim(
                [h - HALF * a for h, a in zip(horst, adamw, strict=True)],
                checks,
                tags="_".join(map(target_tag, high)),
                joined="-".join(high),
                listed=", ".join(high),
                horst=_seeds(horst),
                adamw=_seeds(adamw),
            )
        )
    if "adamw" in have:
        claims.append(
            _near_zero_claim(
                "ViT",
                "the dense ViT's prunable weights (final runs)",
                vision["near_zero_share"],
                [_move_check(moves["horst"]["dense"], "dense ViT, every seed")],
                number(data["rms_fraction"]),
            )
        )
    return claims


def _near_zero_claim(
    model: str,
    weights: str,
    share: Mapping[str, Sequence[Any]],
    checks: Sequence[Check],
    fraction: float,
) -> Claim:
    horst, adamw = _numbers(share["horst"]), _numbers(share["adamw"])
    return NEAR_ZERO.claim(
        [h - a for h, a in zip(horst, adamw, strict=True)],
        checks,
        model_tag=model.lower().replace("character ", "char_"),
        model=model,
        weights=weights,
        fraction=fraction,
        horst=_seeds(horst),
        adamw=_seeds(adamw),
        gaussian=math.erf(fraction / math.sqrt(2)),
        revised="" if model == "ViT" else "design 3: new, the LMs the one-shot claims prune",
    )


def _floor_check(language: Mapping[str, Any]) -> Check:
    """Whether every optimizer's selected LM passed the selection's dense-quality floor (the
    selection falls back to a grid's first point when none does)."""
    selection = language.get("selection")
    if not selection:
        return not_measured(FLOOR.name, FLOOR.required, "the LM selection grids were not stored")

    def dense(point: Mapping[str, Any]) -> float:
        return number(point["validation_perplexity"][LM_SELECTION_PRUNER]["0%"])

    every = [dense(point) for points in selection.values() for point in points]
    finite = [value for value in every if math.isfinite(value)]
    worst = 0.0
    for name, points in selection.items():
        chosen = language["selected"][name]
        matches = [p for p in points if is_point(p, chosen)]
        value = dense(matches[0]) if matches else math.nan
        worst = max(worst, value / min(finite) if finite and math.isfinite(value) else math.inf)
    return FLOOR.check(worst)


def _language_claims(config: Mapping[str, Any], data: Mapping[str, Any]) -> list[Claim]:
    language = data["language"]
    move = _move_check(language["move_ratio"]["horst"], "dense LMs, every seed")
    checks = [move, _floor_check(language)]
    claims = [
        _near_zero_claim(
            "character LM",
            "the dense character LM's prunable weights but the first (block 1's query "
            "projection, which the ViT keeps dense; final runs)",
            language["near_zero_share"],
            checks,
            number(data["rms_fraction"]),
        )
    ]
    run = {sparsity_key(t) for t in config["lm_sparsities"]}
    targets = [sparsity_key(t) for t in LM_TARGETS if sparsity_key(t) in run]
    selection = sparsity_key(max(config["lm_sparsities"]))
    windows = config["lm_calibration_windows"]
    for pruner in config["lm_pruners"]:
        for key in targets:
            claims.append(_pruned_claim(language, pruner, key, selection, windows, checks))
    return claims


def _pruned_claim(
    language: Mapping[str, Any],
    pruner: str,
    key: str,
    selection: str,
    windows: int,
    checks: Sequence[Check],
) -> Claim:
    """The ratio ppl_horst / ppl_adamw after one-shot ``pruner`` to ``key`` (claim 5)."""
    horst = _numbers(language["perplexity"]["horst"][pruner][key])
    adamw = _numbers(language["perplexity"]["adamw"][pruner][key])
    dense_horst = _numbers(language["perplexity"]["horst"][pruner]["0%"])
    dense_adamw = _numbers(language["perplexity"]["adamw"][pruner]["0%"])
    shown = PRUNER_NAMES[pruner]
    stronger = (pruner, key) == (STRONGER_PRUNER, sparsity_key(STRONGER_TARGET))
    role = (
        "stronger"
        if stronger
        else "selection"
        if (pruner, key) == ("magnitude", selection)
        else "other"
    )
    return ONE_SHOT.claim(
        [h / a for h, a in zip(horst, adamw, strict=True)],
        checks,
        extra={"pruner": pruner, "sparsity": key},
        pruner=pruner,
        tag=target_tag(key),
        shown=shown,
        key=key,
        selection=selection,
        calibrated=(
            f", {shown} calibrated on {windows} training windows" if pruner != "magnitude" else ""
        ),
        survives=SURVIVES if stronger else "",
        horst=_seeds(horst),
        adamw=_seeds(adamw),
        dense_horst=_seeds(dense_horst),
        dense_adamw=_seeds(dense_adamw),
        revised=ONE_SHOT_REVISED[role],
    )
