"""Part (c)'s claims, from ``results["data"]["finetune"]`` alone.

1. For each pruned variant (pruner x target): a HORST fine-tune keeps more test accuracy after
   pruning than an AdamW fine-tune. Effect: the mean over final seeds and test sentences of
   (HORST correct - AdamW correct), paired by seed and sentence; holds if >= 0, with the
   two-way interval over seeds and sentences
   (:func:`~convergent.studies.framework.crossed.crossed_interval`). The SparseGPT-70 % claim
   is also where "HORST's advantage survives a pruner that updates the kept weights" lives
   (STUDIES.md rule 14: one result, one claim).
2. Dense accuracy is the same within 2 points, two-sided (the same interval on the dense
   models' marks).

Checks, each able to pass and to fail:
- HORST's mirror/Adam move ratio over the final fine-tunes (mean) is at least 0.2;
- room (claim 1): AdamW's fine-tuned model loses at least 2 points from dense at that variant
  (mean over seeds);
- moved: each optimizer's selected fine-tune reaches a validation accuracy at least 5 points
  above MiniLM with its readout trained alone (the smaller of the two margins).

Every claim stores its resolution (``extra["resolution"]``): the interval's half-width against
its threshold, so the report states the smallest difference this design resolves.
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
    claim_from_seeds,
    crossed_interval,
    finite_mean,
    json_ready,
    margin_resolution,
    mark_differences,
    with_crossed,
    within,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.sparsity.selection import is_point

ROOM_REQUIRED = at_least(0.02)  # AdamW's dense-to-pruned loss that leaves room to help
MOVED_REQUIRED = at_least(0.05)  # the fine-tune's gain over the readout alone
DENSE_MARGIN = 0.02  # "the same dense accuracy": within 2 points
CROSSED_METHOD = "crossed: two-way interval over test sentences and seeds, paired"
PRUNER_NAMES = {"magnitude": "magnitude", "wanda": "Wanda", "sparsegpt": "SparseGPT"}
STRONGER = "sparsegpt 70%"  # the claim that also carries "survives a stronger pruner"


def variant_tag(label: str) -> str:
    """A variant label in a claim key: ``"sparsegpt owl 70%" -> "sparsegpt_owl_70"``."""
    return label.replace("%", "").replace(":", "of").replace(" ", "_")


def finetune_key(label: str) -> str:
    """The key of the claim that a HORST fine-tune keeps more accuracy after ``label``."""
    return f"sparsity.finetune_horst_keeps_accuracy_{variant_tag(label)}"


DENSE_KEY = "sparsity.finetune_dense_accuracy_same"


def shown_variant(label: str) -> str:
    """``"sparsegpt owl 70%" -> "SparseGPT with OWL to 70%"``."""
    parts = label.split()
    owl = " with OWL" if "owl" in parts else ""
    return f"{PRUNER_NAMES[parts[0]]}{owl} to {parts[-1]}"


def _marks_table(
    adamw: Sequence[Mapping[str, Any]], horst: Sequence[Mapping[str, Any]], label: str
) -> list[list[int]]:
    """Per seed, per test sentence: HORST correct minus AdamW correct (-1, 0 or 1); a seed where
    either run diverged is left out."""
    return mark_differences(
        (
            (a["seed"], a["correct"].get(label), h["correct"].get(label))
            for a, h in zip(adamw, horst, strict=True)
        ),
        "AdamW",
        "HORST",
        f" at {label}",
    )


def _move_check(horst: Sequence[Mapping[str, Any]]) -> Check:
    ratios = [number(unit["move_ratio"]) for unit in horst]
    return Check(
        "HORST mirror move / Adam move (final fine-tunes, mean over runs)",
        finite_mean(ratios),
        at_least(acting.MOVE_RATIO_FLOOR),
        "below 0.2 the mirror step moves the weights less than a fifth as far as the Adam step: "
        f"HORST is AdamW in all but name. Runs: {', '.join(f'{r:.3g}' for r in ratios)}.",
    )


def _moved_check(finetune: Mapping[str, Any]) -> Check:
    """The smaller, over the optimizers, of the selected point's dense validation accuracy
    minus the readout-only run's."""
    readout = number(finetune["readout"]["validation_accuracy"])
    gains = []
    for name, chosen in finetune["selected"].items():
        points = finetune["selection"][name]
        match = [p for p in points if is_point(p, chosen)]
        dense = number(match[0]["validation_accuracy"]["dense"]) if match else math.nan
        gains.append(dense - readout)
    return Check(
        "the fine-tune moved the model: selected points' dense validation accuracy minus the "
        "readout-only run's (the smaller of AdamW's and HORST's)",
        min(gains) if gains and all(math.isfinite(g) for g in gains) else math.nan,
        MOVED_REQUIRED,
        f"MiniLM with its readout trained alone: {100 * readout:.2f} % on validation; a "
        "fine-tune within 5 points of it has barely changed the encoder the pruners read",
    )


def _room_check(adamw: Sequence[Mapping[str, Any]], label: str) -> Check:
    drops = [number(u["accuracy"]["dense"]) - number(u["accuracy"][label]) for u in adamw]
    return Check(
        f"AdamW loses at least 2 points from dense to {shown_variant(label)} (mean over seeds)",
        finite_mean(drops),
        ROOM_REQUIRED,
        "where AdamW's fine-tune barely loses accuracy, no optimizer can show a smaller loss",
    )


def _points(values: Sequence[float]) -> str:
    return ", ".join(f"{100 * v:.2f}" for v in values)


def _paired_claim(
    statement: str,
    rows: list[list[int]],
    adamw: Sequence[Mapping[str, Any]],
    horst: Sequence[Mapping[str, Any]],
    label: str,
    threshold: Any,
    margin: float,
    *,
    key: str,
    checks: Sequence[Check],
    revised: str,
) -> Claim:
    per_seed = [statistics.fmean(row) for row in rows]
    crossed = crossed_interval(rows) if len(rows) > 1 else None
    found = margin_resolution(per_seed, crossed, len(rows[0]) if rows else None, margin)
    accuracy_h = [number(u["accuracy"][label]) for u in horst]
    accuracy_a = [number(u["accuracy"][label]) for u in adamw]
    half = number(found["half_width"])
    resolved = (
        f" The design resolves a difference of {100 * half:.2f} points (the interval's "
        f"half-width at {found['sentences']} sentences x {len(rows)} seeds)."
        if math.isfinite(half)
        else " One seed: no interval, so the design resolves no difference."
    )
    claim = claim_from_seeds(
        statement,
        per_seed,
        threshold,
        key=key,
        unit="test accuracy, HORST minus AdamW (fraction)",
        checks=checks,
        evidence=(
            f"test accuracy per seed (%): HORST {_points(accuracy_h)}; AdamW {_points(accuracy_a)}."
            + resolved
        ),
        paired=True,
        extra={"variant": label, "resolution": json_ready(found)},
        revised=revised,
    )
    return with_crossed(claim, crossed, CROSSED_METHOD)


def finetune_claims(finetune: Mapping[str, Any]) -> list[Claim]:
    """Part (c)'s claims (none where its data was not stored)."""
    adamw, horst = finetune["runs"]["adamw"], finetune["runs"]["horst"]
    move, moved = _move_check(horst), _moved_check(finetune)
    selection = (
        "each at the point its grid selected on validation after SparseGPT to 70 % (HORST "
        "points selectable at a move ratio of at least 0.3)"
    )
    revised = "design 4: new, part (c)"
    claims = [
        _paired_claim(
            "(c) A HORST fine-tune of pretrained MiniLM-L6 keeps the same dense test accuracy as "
            f"an AdamW fine-tune, within {100 * DENSE_MARGIN:g} points either way (here: "
            f"rt-sentences, {selection}, paired over seeds and test sentences)",
            _marks_table(adamw, horst, "dense"),
            adamw,
            horst,
            "dense",
            within(-DENSE_MARGIN, DENSE_MARGIN),
            DENSE_MARGIN,
            key=DENSE_KEY,
            checks=[move, moved],
            revised=revised,
        )
    ]
    for label in finetune["variants"]:
        survives = (
            "; this is also the test of whether HORST's advantage survives a pruner that updates "
            "the kept weights"
            if label == STRONGER
            else ""
        )
        claims.append(
            _paired_claim(
                f"(c) After one-shot {shown_variant(label)}, a HORST fine-tune of pretrained "
                "MiniLM-L6 keeps more test accuracy than an AdamW fine-tune (here: rt-sentences, "
                f"{selection}, paired over seeds and test sentences{survives})",
                _marks_table(adamw, horst, label),
                adamw,
                horst,
                label,
                at_least(0.0),
                0.0,
                key=finetune_key(label),
                checks=[move, _room_check(adamw, label), moved],
                revised=revised,
            )
        )
    return claims
