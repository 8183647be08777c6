"""The claims of the ``descent`` study, scored from a ``results.json`` payload alone.

Every effect is one number per final seed: the paired difference of the selected ERM and
constrained configurations trained from that seed (same data order, same perturbation
draws). Thresholds and checks, written down before the run:

- clean accuracy within 0.3 point of ERM (the paper's figure) and within 1 point;
- under each perturbation kind, accuracy averaged over its levels at least 1 point above
  ERM's;
- per-layer losses monotone up to a tolerance where ERM's are not: no layer's test loss more
  than 1 % above the previous layer's (the report shows the seed spread of ERM's
  layer-to-layer changes beside it), with larger bumps in at least half of the ERM seeds;
- the denoiser's RMSE at least 1 % lower than ERM's at every noise level at or beyond twice
  the training level.

Manipulation checks: the largest multiplier during training at least 0.1 and some
constraint active (lambda_l > 0) in at least 20 % of the training steps, in every seed.
The design is ``DESIGN``, stored in the payload as ``data["design"]``.
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
    check_design,
    claim_from_seeds,
    not_measured,
)

DESIGN = 2
CLEAN_PAPER_MARGIN = 0.003  # the paper: clean accuracy within 0.3 %
CLEAN_MARGIN = 0.01  # accuracy: the constrained model at most 1 point below ERM
ROBUSTNESS_MARGIN = 0.01  # accuracy (1 point)
RMSE_MARGIN = 0.01  # relative
OOD_MULTIPLE = 2.0  # test noise levels at or beyond this multiple of the training level
MONOTONE_TOLERANCE = 0.01  # a bump: a layer's loss more than 1 % above the previous layer's
# Manipulation checks.
MULTIPLIER_FLOOR = acting.MULTIPLIER_FLOOR
ACTIVE_SHARE_FLOOR = acting.ACTIVE_SHARE_FLOOR
BUMP_SHARE_FLOOR = 0.5

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
        f"largest multiplier lambda_l during training, {part} (max over layers and steps; "
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
            f"share of training steps with an active constraint (some lambda_l > 0), {part} "
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
        f"share of ERM seeds whose per-layer test loss rises more than "
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


def _pairs(runs: Mapping[str, list[Record]]) -> tuple[list[Record], list[Record]]:
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
    runs: Mapping[str, list[Record]], part: str, unit: str, checks: Sequence[Check]
) -> Claim:
    """Per-layer losses monotone (up to the tolerance) where ERM's have bumps."""
    erm, constrained = _pairs(runs)
    rises = [largest_relative_increase(c["layer_losses"]) for c in constrained]
    erm_rises = [largest_relative_increase(e["layer_losses"]) for e in erm]
    return claim_from_seeds(
        f"{part} Descent-constrained training gives per-layer losses that fall monotonically "
        "across layers where ERM's do not (here: no layer's test loss more than "
        f"{100 * MONOTONE_TOLERANCE:g} % above the previous layer's, with larger bumps in at "
        f"least {100 * BUMP_SHARE_FLOOR:g} % of the ERM seeds).",
        rises,
        at_most(MONOTONE_TOLERANCE),
        unit=f"largest relative rise of the per-layer test {unit}, constrained model "
        "(max_l f_l / f_(l-1) - 1)",
        checks=[*checks, _bumps_check(erm, part)],
        evidence=f"largest relative rise per seed: constrained {_numbers(rises)}, ERM "
        f"{_numbers(erm_rises)}; across-seed spread of ERM's layer-to-layer changes: "
        f"{_change_spread(erm)}. Constrained: {_summary(constrained)}.",
    )


def text_claims(text: Mapping[str, Any]) -> list[Claim]:
    """Part (a): clean accuracy (two margins), each perturbation kind, monotone losses."""
    erm, constrained = _pairs(text["runs"])
    checks = exercised(constrained, "text")
    clean = [c["clean"] - e["clean"] for e, c in zip(erm, constrained, strict=True)]
    evidence = (
        f"clean test accuracy: constrained {100 * _mean(constrained, 'clean'):.2f} %, ERM "
        f"{100 * _mean(erm, 'clean'):.2f} %; per seed difference {_points(clean)} points."
    )
    claims = [
        claim_from_seeds(
            f"(a) Clean accuracy within {100 * margin:g} point of ERM{source} (here: "
            f"constrained minus ERM at least -{100 * margin:g} point).",
            clean,
            at_least(-margin),
            unit="accuracy (fraction; constrained minus ERM, clean test set)",
            checks=checks,
            evidence=evidence,
            paired=True,
        )
        for margin, source in ((CLEAN_PAPER_MARGIN, ", the paper's figure"), (CLEAN_MARGIN, ""))
    ]
    for kind, levels in text["levels"].items():
        gains = [
            statistics.fmean(c[kind]) - statistics.fmean(e[kind])
            for e, c in zip(erm, constrained, strict=True)
        ]
        claims.append(
            claim_from_seeds(
                f"(a) Under {kind.replace('_', ' ')} the constrained model is more accurate "
                f"than ERM (here: accuracy averaged over the levels {list(levels)} at least "
                f"{100 * ROBUSTNESS_MARGIN:g} point higher).",
                gains,
                at_least(ROBUSTNESS_MARGIN),
                unit="accuracy (fraction; constrained minus ERM, mean over levels)",
                checks=checks,
                evidence=f"mean accuracy over levels: constrained "
                f"{100 * statistics.fmean(statistics.fmean(c[kind]) for c in constrained):.1f} %, "
                f"ERM {100 * statistics.fmean(statistics.fmean(e[kind]) for e in erm):.1f} %; "
                f"per seed difference {_points(gains)} points.",
                paired=True,
            )
        )
    claims.append(monotone_claim(text["runs"], "(a)", "cross-entropy", checks))
    return claims


def video_claims(video: Mapping[str, Any], noise_multiples: Sequence[float]) -> list[Claim]:
    """Part (b): RMSE beyond the training noise, monotone per-layer losses."""
    erm, constrained = _pairs(video["runs"])
    checks = exercised(constrained, "video")
    beyond = [i for i, multiple in enumerate(noise_multiples) if multiple >= OOD_MULTIPLE]
    reductions = [
        min((1 - c["rmse"][i] / e["rmse"][i] for i in beyond), default=math.nan)
        for e, c in zip(erm, constrained, strict=True)
    ]
    levels = "; ".join(
        f"{noise_multiples[i]:g}x: constrained {_mean(constrained, 'rmse', i):.4f}, "
        f"ERM {_mean(erm, 'rmse', i):.4f}"
        for i in beyond
    )
    return [
        claim_from_seeds(
            f"(b) Under noise beyond the training level (>= {OOD_MULTIPLE:g}x) the constrained "
            f"denoiser has lower test RMSE than ERM (here: at least {100 * RMSE_MARGIN:g} % "
            "lower at every such level).",
            reductions,
            at_least(RMSE_MARGIN),
            unit="relative RMSE reduction (fraction, 1 - constrained / ERM, worst level)",
            checks=checks,
            evidence=f"mean test RMSE {levels}; worst-level reduction per seed "
            f"{_numbers(reductions)}.",
            paired=True,
        ),
        monotone_claim(video["runs"], "(b)", "MSE", checks),
    ]


def claims_from_results(results: Mapping[str, Any]) -> list[Claim]:
    """Every claim of the study from ``results["config"]`` and ``results["data"]`` alone."""
    config, data = results["config"], results["data"]
    check_design("descent", data.get("design"), DESIGN)
    return [
        *text_claims(data["text"]),
        *video_claims(data["video"], [float(m) for m in config["noise_multiples"]]),
    ]


def _mean(records: Sequence[Record], key: str, index: int | None = None) -> float:
    return statistics.fmean(r[key] if index is None else r[key][index] for r in records)


def _numbers(values: Sequence[float]) -> str:
    return ", ".join(f"{value:.4g}" for value in values)


def _points(values: Sequence[float]) -> str:
    return ", ".join(f"{100 * value:.1f}" for value in values)
