"""What the ``descent`` study's three parts share in their claims: the manipulation checks
(the multipliers grew and were active, in every seed) and the claim that per-layer losses fall
monotonically where ERM's do not, with its check that ERM's have bumps.

Thresholds, written down before the run: the largest multiplier during training at least 0.1
and some constraint active (lambda_l > 0) in at least 20 % of the training steps, in every
seed; monotone up to a tolerance: no layer's test loss more than 1 % above the previous
layer's (the report shows the seed spread of ERM's layer-to-layer changes beside it), with
larger bumps in at least half of the ERM seeds.
"""

from __future__ import annotations

import itertools
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
    claim_from_seeds,
    not_measured,
)

MONOTONE_TOLERANCE = 0.01  # a bump: a layer's loss more than 1 % above the previous layer's
# Manipulation checks.
MULTIPLIER_FLOOR = acting.MULTIPLIER_FLOOR
ACTIVE_SHARE_FLOOR = acting.ACTIVE_SHARE_FLOOR
BUMP_SHARE_FLOOR = 0.5
# How each check's name starts: summaries and briefs find a check by it (stored results carry
# no other handle on a check).
PEAK_CHECK = "largest multiplier"
ACTIVE_CHECK = "share of training steps"
BUMP_CHECK = "share of ERM seeds"

MULTIPLIER_REASON = (
    "below 0.1 the constraint terms weigh less than a tenth of the objective f_L in the "
    "Lagrangian, so the run is ERM in all but name"
)
BUMP_REASON = (
    "if ERM's per-layer losses are monotone too, the setting cannot show the claimed contrast"
)

Record = dict[str, Any]


def constraints_acted(constrained: Sequence[Record], part: str) -> Check:
    """The check that the multipliers grew enough to change the objective, in every seed.

    Args:
        constrained: the constrained runs' records of one part.
        part: ``"text"`` or ``"video"``, for the check's name.
    """
    name = (
        f"{PEAK_CHECK} lambda_l during training, {part} (max over layers and steps; "
        "smallest over seeds)"
    )
    required = at_least(MULTIPLIER_FLOOR)
    maxima = [record.get("multiplier_max") for record in constrained]
    measured = [float(value) for value in maxima if value is not None]
    if maxima and len(measured) == len(maxima):
        return Check(name, min(measured), required, note=MULTIPLIER_REASON)
    return not_measured(
        name, required, "a seed recorded no multiplier during training (a diverged run)"
    )


def largest_relative_increase(losses: Sequence[float]) -> float:
    """max_l (f_l / f_(l-1) - 1): how far one layer's loss rises above the previous layer's,
    relative to it (scale-free: a denoiser's losses span orders of magnitude across layers)."""
    return max(after / before - 1 for before, after in itertools.pairwise(losses))


def exercised(constrained: Sequence[Record], part: str) -> list[Check]:
    """The manipulation checks of a part: the multipliers grew, and they were active."""
    active = [r.get("multiplier_active_share") for r in constrained]
    measured = [float(a) for a in active if a is not None]
    return [
        constraints_acted(constrained, part),
        Check(
            f"{ACTIVE_CHECK} with an active constraint (some lambda_l > 0), {part} "
            "(smallest over seeds)",
            min(measured) if measured and len(measured) == len(active) else math.nan,
            at_least(ACTIVE_SHARE_FLOOR),
            note="a constraint that is active in few steps barely changes the training",
        ),
    ]


def _bumps_check(erm: Sequence[Record], part: str) -> Check:
    rises = [largest_relative_increase(r["layer_losses"]) for r in erm]
    finite = [rise for rise in rises if math.isfinite(rise)]
    share = sum(rise > MONOTONE_TOLERANCE for rise in finite) / len(finite) if finite else math.nan
    return Check(
        f"{BUMP_CHECK} whose per-layer test loss rises more than "
        f"{100 * MONOTONE_TOLERANCE:g} % from one layer to the next, {part}",
        share,
        at_least(BUMP_SHARE_FLOOR),
        note=BUMP_REASON,
    )


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


def _summary(records: Sequence[Record]) -> str:
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
        f"{_change_spread(erm)}. Constrained: {_summary(constrained)}.{note}",
        revised=revised,
    )


def mean_of(records: Sequence[Record], key: str, index: int | None = None) -> float:
    return statistics.fmean(r[key] if index is None else r[key][index] for r in records)


def numbers_text(values: Sequence[float]) -> str:
    return ", ".join(f"{value:.4g}" for value in values)


def points_text(values: Sequence[float]) -> str:
    return ", ".join(f"{100 * value:.1f}" for value in values)
