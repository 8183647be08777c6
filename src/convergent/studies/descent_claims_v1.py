"""The first design's claims of the ``descent`` study (no grids, no validation split), kept
so that payloads written by it still re-score: :mod:`.descent_claims` dispatches here.

Every effect is one number per seed; where ERM and the constrained model share a seed (same
initialization, data order and noise draws) it is their paired difference. The thresholds
were fixed before any run and are the ones the study has always used.

Payloads written before the multipliers were tracked during training (the committed 3-seed
full run) hold only the final multipliers. A final multiplier is a lower bound of the
largest one during training, so it can pass the "constraints acted" check but never fail it:
below the floor the check is reported as not measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from convergent.studies.framework import (
    Check,
    Claim,
    at_least,
    at_most,
    claim_from_seeds,
    not_measured,
)

from ..diagnostics import acting

# Fixed before any run: differences smaller than these are not counted as an effect.
ROBUSTNESS_MARGIN = 0.01  # accuracy (1 point)
RMSE_MARGIN = 0.01  # relative
CLEAN_MARGIN = 0.01  # accuracy: the constrained model may be at most 1 point below ERM
OOD_MULTIPLE = 2.0  # test noise levels at or beyond this multiple of the training level
# Manipulation checks.
MULTIPLIER_FLOOR = acting.MULTIPLIER_FLOOR
BUMP_SHARE_FLOOR = 0.5

MULTIPLIER_REASON = (
    "below 0.1 the constraint terms weigh less than a tenth of the objective f_L in the "
    "Lagrangian, so the run is ERM in all but name"
)
BUMP_REASON = (
    "if ERM's per-layer losses are monotone too, the setting cannot show the claimed contrast"
)

Record = dict[str, Any]


def paired_runs(runs: dict[str, list[Record]]) -> list[tuple[Record, Record]]:
    """``(erm, constrained)`` records that share a seed, in the constrained runs' order."""
    erm = {record["seed"]: record for record in runs["erm"]}
    return [(erm[r["seed"]], r) for r in runs["constrained"] if r["seed"] in erm]


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
    finals = [max(record["multipliers"], default=0.0) for record in constrained]
    if finals and min(finals) >= MULTIPLIER_FLOOR:
        return Check(
            name,
            min(finals),
            required,
            note="lower bound: the final multiplier; the maximum during training was not "
            f"stored ({MULTIPLIER_REASON})",
        )
    shown = ", ".join(f"{value:.2g}" for value in finals) or "none"
    return not_measured(
        name,
        required,
        "the maximum during training was not stored; the final multipliers (largest per "
        f"seed: {shown}; largest {max(finals, default=0.0):.2g}) are below "
        f"{MULTIPLIER_FLOOR:g} and only bound it from below",
    )


def erm_has_bumps(erm: Sequence[Record], part: str) -> Check:
    """The check that the baseline had room to fail: ERM's per-layer loss has a bump."""
    share = sum(not record["is_monotone"] for record in erm) / len(erm) if erm else math.nan
    return Check(
        f"share of ERM seeds whose per-layer test loss has a bump (is not monotone), {part}",
        share,
        at_least(BUMP_SHARE_FLOOR),
        note=BUMP_REASON,
    )


def claims_from_results(results: dict[str, Any]) -> list[Claim]:
    """Every claim of the study from ``results["config"]`` and ``results["data"]`` alone."""
    config, data = results["config"], results["data"]
    return [
        *text_claims(data["text"], float(config["alpha"])),
        *video_claims(data["video"], [float(m) for m in config["noise_multiples"]]),
    ]


def text_claims(text: dict[str, Any], alpha: float) -> list[Claim]:
    """Part (a): monotone per-layer losses, robustness per perturbation kind, clean accuracy."""
    pairs = paired_runs(text["runs"])
    erm = [e for e, _ in pairs]
    constrained = [c for _, c in pairs]
    acted = constraints_acted(constrained, "text")
    activity = _activity(constrained)
    increases = [c["largest_increase"] for c in constrained]
    claims = [
        claim_from_seeds(
            "(a) Descent-constrained training gives per-layer losses that fall monotonically "
            "across layers, where ERM shows bumps (here: the constrained model's largest "
            "increase max_l (f_l - f_(l-1)) of per-layer test loss is at most 0, with bumps "
            f"in at least {100 * BUMP_SHARE_FLOOR:g} % of the ERM seeds).",
            increases,
            at_most(0.0),
            unit="cross-entropy (largest layer-to-layer increase, constrained model)",
            checks=[acted, erm_has_bumps(erm, "text")],
            evidence=f"test per-layer losses monotone in {_monotone(constrained)} constrained "
            f"runs and {_monotone(erm)} ERM runs; largest increase per seed: constrained "
            f"{_numbers(increases)}, ERM {_numbers([e['largest_increase'] for e in erm])}; "
            f"constraints satisfied (alpha={alpha:g}): constrained "
            f"{_mean(constrained, 'fraction_satisfied'):.2f}, ERM "
            f"{_mean(erm, 'fraction_satisfied'):.2f}; {activity}.",
        )
    ]
    for kind, gammas in text["levels"].items():
        drops = {
            name: [_drop(record, kind) for record in records]
            for name, records in (("erm", erm), ("constrained", constrained))
        }
        claims.append(
            claim_from_seeds(
                f"(a) Under {kind} token-embedding perturbations the constrained model degrades "
                f"more gracefully than ERM (here: a mean accuracy drop at least "
                f"{100 * ROBUSTNESS_MARGIN:g} point smaller).",
                [e - c for e, c in zip(drops["erm"], drops["constrained"], strict=True)],
                at_least(ROBUSTNESS_MARGIN),
                unit="accuracy (fraction; ERM's mean drop minus the constrained model's)",
                checks=[acted],
                evidence=f"mean accuracy drop over gamma in {list(gammas)}: constrained "
                f"{100 * statistics.fmean(drops['constrained']):.1f} points, ERM "
                f"{100 * statistics.fmean(drops['erm']):.1f} points (per seed: constrained "
                f"{_points(drops['constrained'])}, ERM {_points(drops['erm'])}).",
                paired=True,
            )
        )
    claims.append(
        claim_from_seeds(
            "(a) Clean accuracy stays within a fraction of a point of ERM (here: at most "
            f"{100 * CLEAN_MARGIN:g} point lower).",
            [c["clean"] - e["clean"] for e, c in pairs],
            at_least(-CLEAN_MARGIN),
            unit="accuracy (fraction; constrained minus ERM, clean test set)",
            checks=[acted],
            evidence=f"clean test accuracy: constrained {100 * _mean(constrained, 'clean'):.1f} "
            f"%, ERM {100 * _mean(erm, 'clean'):.1f} % on {text['test_examples']} test "
            "sentences.",
            paired=True,
        )
    )
    return claims


def video_claims(video: dict[str, Any], noise_multiples: Sequence[float]) -> list[Claim]:
    """Part (b): lower RMSE under out-of-distribution noise, monotone per-layer losses."""
    pairs = paired_runs(video["runs"])
    erm = [e for e, _ in pairs]
    constrained = [c for _, c in pairs]
    acted = constraints_acted(constrained, "video")
    beyond = [i for i, multiple in enumerate(noise_multiples) if multiple >= OOD_MULTIPLE]
    reductions = [
        min((1 - c["rmse"][i] / e["rmse"][i] for i in beyond), default=math.nan) for e, c in pairs
    ]
    levels = "; ".join(
        f"{noise_multiples[i]:g}x: constrained {_mean(constrained, 'rmse', i):.4f}, "
        f"ERM {_mean(erm, 'rmse', i):.4f}"
        for i in beyond
    )
    increases = [c["largest_increase"] for c in constrained]
    return [
        claim_from_seeds(
            f"(b) Under out-of-distribution noise (>= {OOD_MULTIPLE:g}x the training level) the "
            f"constrained denoiser has lower test RMSE than ERM (here: at least "
            f"{100 * RMSE_MARGIN:g} % lower at every such level).",
            reductions,
            at_least(RMSE_MARGIN),
            unit="relative RMSE reduction (fraction, 1 - constrained / ERM, worst level)",
            checks=[acted],
            evidence=(
                f"mean test RMSE {levels}; worst-level reduction per seed {_numbers(reductions)}."
                if beyond
                else f"no test level at or beyond {OOD_MULTIPLE:g}x."
            ),
            paired=True,
        ),
        claim_from_seeds(
            "(b) The constrained denoiser's per-layer losses fall monotonically across layers "
            "(here: its largest increase max_l (f_l - f_(l-1)) of per-layer test MSE is at "
            f"most 0, with bumps in at least {100 * BUMP_SHARE_FLOOR:g} % of the ERM seeds).",
            increases,
            at_most(0.0),
            unit="MSE (largest layer-to-layer increase, constrained model)",
            checks=[acted, erm_has_bumps(erm, "video")],
            evidence=f"monotone in {_monotone(constrained)} constrained runs and "
            f"{_monotone(erm)} ERM runs; largest increase per seed: constrained "
            f"{_numbers(increases)}, ERM {_numbers([e['largest_increase'] for e in erm])}; "
            f"largest final multiplier "
            f"{max((max(c['multipliers'], default=0.0) for c in constrained), default=0.0):.2g}"
            f" (0 means the constraints never bound at the end); "
            f"{_activity(constrained)}.",
        ),
    ]


def _drop(record: Record, kind: str) -> float:
    """Mean over the kind's levels of clean minus perturbed accuracy, in one run."""
    return statistics.fmean(record["clean"] - accuracy for accuracy in record[kind])


def _activity(constrained: Sequence[Record]) -> str:
    shares = [record.get("multiplier_active_share") for record in constrained]
    if not shares or any(share is None for share in shares):
        return "share of training steps with an active constraint (some lambda_l > 0): not stored"
    return (
        "share of training steps with an active constraint (some lambda_l > 0) per seed: "
        + ", ".join(f"{share:.2f}" for share in shares)
    )


def _monotone(records: Sequence[Record]) -> str:
    return f"{sum(bool(r['is_monotone']) for r in records)}/{len(records)}"


def _mean(records: Sequence[Record], key: str, index: int | None = None) -> float:
    return statistics.fmean(r[key] if index is None else r[key][index] for r in records)


def _numbers(values: Sequence[float]) -> str:
    return ", ".join(f"{value:.4g}" for value in values)


def _points(values: Sequence[float]) -> str:
    return ", ".join(f"{100 * value:.1f}" for value in values)
