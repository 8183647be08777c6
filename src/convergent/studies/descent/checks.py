"""What the ``descent`` study's three parts share in their claims: the claims' keys, the
manipulation checks (the multipliers grew and were active, in every seed) as records, and the
claim that per-layer losses fall monotonically where ERM's do not, with its check that ERM's
have bumps, and the builder of a claim whose interval spans test examples and seeds together
(:func:`crossed_claim`: part (a)'s clean claims, part (c)'s win rates).

Thresholds, written down before the run: the largest multiplier during training at least 0.1
and some constraint active (lambda_l > 0) in at least 20 % of the training steps, in every
seed; monotone up to a tolerance: no layer's test loss more than 1 % above the previous
layer's (the report shows the seed spread of ERM's layer-to-layer changes beside it), with
larger bumps in at least half of the ERM seeds.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.engine import CheckSpec
from convergent.studies.framework import (
    Check,
    Claim,
    CrossedInterval,
    Threshold,
    at_least,
    at_most,
    claim_from_seeds,
    crossed_interval,
    margin_resolution,
    with_crossed,
)

# Summaries, reports and history find a claim by its key, never by its wording.
CLEAN_PAPER_KEY = "descent.text_clean_within_paper_margin"
CLEAN_KEY = "descent.text_clean_within_1_point"
TEXT_MONOTONE_KEY = "descent.text_layers_monotone"
VIDEO_NOISE_KEY = "descent.video_lower_rmse_beyond_training_noise"
VIDEO_MONOTONE_KEY = "descent.video_layers_monotone"
LANGUAGE_CLEAN_KEY = "descent.language_clean_win_rate_even"
LANGUAGE_NOISE_KEY = "descent.language_noisy_win_rate_above_half"
LANGUAGE_MONOTONE_KEY = "descent.language_layers_monotone"
# The parts' grid searches, as `results.json`'s ``tuning`` names them.
TEXT_TUNING = "(a) MiniLM on rt-sentences, selection seed"
VIDEO_TUNING = "(b) street-video denoiser, selection seed"
LANGUAGE_TUNING = "(c) Austen language model, selection seed"


def robustness_key(kind: str) -> str:
    """The key of part (a)'s claim under perturbation ``kind`` (a key of ``data.text.levels``)."""
    return f"descent.text_robust_to_{kind}"


MONOTONE_TOLERANCE = 0.01  # a bump: a layer's loss more than 1 % above the previous layer's
BUMP_SHARE_FLOOR = 0.5
# How each check's name starts: summaries and briefs find a check by it (stored results carry
# no other handle on a check).
PEAK_CHECK = "largest multiplier"
ACTIVE_CHECK = "share of training steps"
BUMP_CHECK = "share of ERM seeds"
# ``{part}`` in a name is the part's label.
PEAK = CheckSpec(
    f"{PEAK_CHECK} lambda_l during training, {{part}} (max over layers and steps; smallest "
    "over seeds)",
    at_least(acting.MULTIPLIER_FLOOR),
    "min",
    note="below 0.1 the constraint terms weigh less than a tenth of the objective f_L in the "
    "Lagrangian, so the run is ERM in all but name",
    missing="a seed recorded no multiplier during training (a diverged run)",
    finite="kept",
)
ACTIVE = CheckSpec(
    f"{ACTIVE_CHECK} with an active constraint (some lambda_l > 0), {{part}} (smallest over seeds)",
    at_least(acting.ACTIVE_SHARE_FLOOR),
    "min",
    note="a constraint that is active in few steps barely changes the training",
    missing="",
    finite="kept",
)
BUMPS = CheckSpec(
    f"{BUMP_CHECK} whose per-layer test loss rises more than {100 * MONOTONE_TOLERANCE:g} % "
    "from one layer to the next, {part}",
    at_least(BUMP_SHARE_FLOOR),
    "min",
    note="if ERM's per-layer losses are monotone too, the setting cannot show the claimed contrast",
    missing="",
    finite="kept",
)

Record = dict[str, Any]


def _named(spec: CheckSpec, part: str) -> CheckSpec:
    return dataclasses.replace(spec, name=spec.name.format(part=part))


def _smallest(values: Sequence[Any]) -> list[float]:
    """The smallest of ``values``, alone, or nothing where a seed recorded none."""
    return [min(map(float, values))] if values and None not in values else []


def constraints_acted(constrained: Sequence[Record], part: str) -> Check:
    """The check that the multipliers grew enough to change the objective, in every seed."""
    maxima = [record.get("multiplier_max") for record in constrained]
    return _named(PEAK, part).check(_smallest(maxima))


def exercised(constrained: Sequence[Record], part: str) -> list[Check]:
    """The manipulation checks of a part: the multipliers grew, and they were active."""
    active = [record.get("multiplier_active_share") for record in constrained]
    return [
        constraints_acted(constrained, part),
        _named(ACTIVE, part).check(_smallest(active) or [math.nan]),
    ]


def largest_relative_increase(losses: Sequence[float]) -> float:
    """max_l (f_l / f_(l-1) - 1): how far one layer's loss rises above the previous layer's,
    relative to it (scale-free: a denoiser's losses span orders of magnitude across layers)."""
    return max(after / before - 1 for before, after in itertools.pairwise(losses))


def _bumps_check(erm: Sequence[Record], part: str) -> Check:
    rises = [largest_relative_increase(r["layer_losses"]) for r in erm]
    finite = [rise for rise in rises if math.isfinite(rise)]
    share = sum(rise > MONOTONE_TOLERANCE for rise in finite) / len(finite) if finite else math.nan
    return _named(BUMPS, part).check([share])


def _change_spread(erm: Sequence[Record]) -> str:
    """The across-seed spread of ERM's relative layer-to-layer changes, largest over layers."""
    changes = [
        [after / before - 1 for before, after in itertools.pairwise(r["layer_losses"])]
        for r in erm
        if all(map(math.isfinite, r["layer_losses"]))
    ]
    if len(changes) < 2:
        return "n/a (fewer than 2 ERM seeds)"
    spreads = [statistics.stdev(column) for column in zip(*changes, strict=True)]
    return f"{100 * statistics.median(spreads):.2g} % median, {100 * max(spreads):.2g} % largest"


def paired_runs(runs: Mapping[str, list[Record]]) -> tuple[list[Record], list[Record]]:
    """The ERM and constrained records that share a seed, in the constrained runs' order."""
    erm = {record["seed"]: record for record in runs["erm"]}
    pairs = [(erm[r["seed"]], r) for r in runs["constrained"] if r["seed"] in erm]
    return [e for e, _ in pairs], [c for _, c in pairs]


def _constraints(records: Sequence[Record]) -> str:
    """Largest lambda, active share and constraints satisfied on train and test, per seed."""

    def shown(key: str) -> str:
        values = [r.get(key) for r in records]
        return ", ".join("n/a" if v is None else f"{float(v):.3g}" for v in values)

    return (
        f"largest lambda per seed {shown('multiplier_max')}; share of steps active "
        f"{shown('multiplier_active_share')}; constraints satisfied on train "
        f"{shown('train_fraction_satisfied')}, on test {shown('fraction_satisfied')}"
    )


def monotone_claim(
    runs: Mapping[str, list[Record]],
    part: str,
    key: str,
    unit: str,
    checks: Sequence[Check],
    revised: str = "",
    note: str = "",
) -> Claim:
    """Per-layer losses monotone (up to the tolerance) where ERM's have bumps."""
    erm, constrained = paired_runs(runs)
    rises = [largest_relative_increase(c["layer_losses"]) for c in constrained]
    erm_rises = [largest_relative_increase(e["layer_losses"]) for e in erm]
    return claim_from_seeds(
        f"{part} Descent-constrained training gives per-layer losses that fall monotonically "
        "across layers where ERM's do not (here: no layer's test loss more than "
        f"{100 * MONOTONE_TOLERANCE:g} % above the previous layer's, with larger bumps in at "
        f"least {100 * BUMP_SHARE_FLOOR:g} % of the ERM seeds).",
        rises,
        at_most(MONOTONE_TOLERANCE),
        key=key,
        unit=f"largest relative rise of the per-layer test {unit}, constrained model "
        "(max_l f_l / f_(l-1) - 1)",
        checks=[*checks, _bumps_check(erm, part)],
        evidence=f"largest relative rise per seed: constrained {numbers_text(rises)}, ERM "
        f"{numbers_text(erm_rises)}; across-seed spread of ERM's layer-to-layer changes: "
        f"{_change_spread(erm)}. Constrained: {_constraints(constrained)}.{note}",
        revised=revised,
    )


def mean_of(records: Sequence[Record], key: str, index: int | None = None) -> float:
    return statistics.fmean(r[key] if index is None else r[key][index] for r in records)


def numbers_text(values: Sequence[float]) -> str:
    return ", ".join(f"{value:.4g}" for value in values)


def points_text(values: Sequence[float]) -> str:
    return ", ".join(f"{100 * value:.1f}" for value in values)


# The two-way interval's description: what a test example is (plural, singular) and its marks.
CROSSED_METHOD = (
    "95 % interval over test {} and seeds together (two-way crossed random effects on the "
    "per-{} {}, Satterthwaite degrees of freedom)"
)


def crossed_of(table: Sequence[Sequence[float]]) -> CrossedInterval | None:
    """The two-way interval of a seeds x examples table; None below 2 seeds or 2 examples."""
    return crossed_interval(table) if len(table) > 1 else None


def crossed_claim(
    statement: str,
    per_seed: Sequence[float],
    table: Sequence[Sequence[float]],
    threshold: Threshold,
    margin: float,
    method: str,
    evidence: Callable[[Mapping[str, Any]], str],
    **fields: Any,
) -> Claim:
    """A paired claim with the two-way interval over ``table``'s rows (seeds) and columns (test
    sentences or windows) where there is one (:func:`crossed_of`); ``evidence(found)`` the
    evidence given the margin's resolution."""
    crossed = crossed_of(table)
    found = margin_resolution(per_seed, crossed, len(table[0]) if table else None, margin)
    claim = claim_from_seeds(
        statement,
        per_seed,
        threshold,
        evidence=evidence(found),
        paired=True,
        extra={"resolution": found},
        **fields,
    )
    return with_crossed(claim, crossed, method)
