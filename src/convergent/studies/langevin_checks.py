"""The `langevin` study's manipulation checks (designs 2 and 3; see `langevin_claims`).

Each check is a measured quantity that shows a claim's method acted, with its declared
threshold; a failed check makes the claim's verdict ``untested``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from convergent.studies import langevin_claims_v1 as v1
from convergent.studies.framework.claims import Check, at_least, at_most, not_measured
from convergent.studies.framework.claims import stored_number as number
from convergent.studies.langevin_measures import (
    NOISE_AT_LEAST,
    NOISE_CHECK,
    Experiment,
    final,
    largest,
    mean,
    noise_check,
    total_end_norm,
)

ACTED_AT_MOST = v1.ACTED_AT_MOST
RUN_LENGTH_CHECK = "run steps / radial relaxation steps (shortest over seeds and penalties)"
OVERFIT_CHECK = "validation RMSE / train RMSE after phase 1 in the chosen regime (pilot)"
OUTCOME_CHECK = "|final test RMSE at s - at s = 0| / phase-1 test RMSE"
FIT_CHECK = "final train RMSE / phase-1 train RMSE"


def acted_check(experiment: Experiment, temperature: str) -> Check:
    """The regularizer acted: the larger over penalties of the mean over seeds of
    total end norm with it / without it."""
    name = f"{v1.REGULARIZER_CHECK}, {temperature} temperature"
    penalties = experiment.penalties(temperature)
    if not penalties or not experiment.has(temperature, "none"):
        return not_measured(name, at_most(ACTED_AT_MOST), "no unregularized or regularized run")
    without = [total_end_norm(r) for r in experiment.records(temperature, "none")]
    ratios = {
        p: mean(
            [
                total_end_norm(r) / n
                for r, n in zip(experiment.records(temperature, p), without, strict=True)
            ]
        )
        for p in penalties
    }
    note = (
        "a regularizer that leaves the end norm within 10 % of the unregularized run did not "
        "act; " + ", ".join(f"{p} {ratio:.3f}" for p, ratio in ratios.items())
    )
    return Check(name, max(ratios.values()), at_most(ACTED_AT_MOST), note)


def noise_acted(experiment: Experiment, temperature: str) -> Check:
    """The noise acted on the unregularized run at ``temperature`` (`noise_check`)."""
    if not experiment.has(temperature, "none"):
        return not_measured(NOISE_CHECK, at_least(NOISE_AT_LEAST), "no unregularized run")
    traces = [list(r["trace"]) for r in experiment.records(temperature, "none")]
    return noise_check(traces, experiment.lr, experiment.temperatures[temperature])


def run_length_check(experiment: Experiment, temperature: str, multiple: float) -> Check:
    """The runs lasted ``multiple`` relaxation times: a bound tested before the norm can settle
    says nothing."""
    lengths = [
        number(r["steps"]) / number(r["relaxation_steps"])
        for p in experiment.penalties(temperature)
        for r in experiment.records(temperature, p)
    ]
    if not lengths or not all(map(math.isfinite, lengths)):
        return not_measured(RUN_LENGTH_CHECK, at_least(multiple), "no finite relaxation time")
    note = f"the run lasts at least {multiple:g} relaxation times, so the norm can settle"
    return Check(RUN_LENGTH_CHECK, min(lengths), at_least(multiple), note)


def overfit_check(data: Mapping[str, Any]) -> Check:
    """The regime can overfit (the pilot's ratio): else no gap can creep up."""
    regime = data.get("regime")
    if not regime:
        return not_measured(OVERFIT_CHECK, at_least(1.0), "no pilot regime stored")
    required = at_least(number(regime["overfit_required"]))
    note = (
        f"regime {regime['name']!r} ({regime['train_fields']} training fields, d_model "
        f"{regime['d_model']}); without room to overfit the gap cannot creep up"
    )
    return Check(OVERFIT_CHECK, number(regime["overfit_ratio"]), required, note)


def _per_seed_mean(values: Sequence[Sequence[float]], pick: Callable[..., float]) -> float:
    """The mean over seeds of ``pick`` (min or max) over the variants of each seed."""
    return mean([pick(seed) for seed in zip(*values, strict=True)])


def outcome_moved_check(
    experiment: Experiment, temperature: str, variants: Sequence[str], required: float
) -> Check:
    """The noise changed the outcome: in every variant of ``variants``, the final test RMSE at
    ``temperature`` differs from the same seed's s = 0 run (same data order, same start) by at
    least ``required`` x the phase-1 test RMSE; the smallest over the variants, mean over seeds."""
    name = f"{OUTCOME_CHECK} ({', '.join(variants)})"
    if not all(experiment.has("zero", v) and experiment.has(temperature, v) for v in variants):
        return not_measured(name, at_least(required), "no s = 0 run to compare with")
    moved = [
        [
            abs(final(r, "test_rmse") - final(z, "test_rmse")) / p
            for r, z, p in zip(
                experiment.records(temperature, v),
                experiment.records("zero", v),
                experiment.pretrained_test,
                strict=True,
            )
        ]
        for v in variants
    ]
    note = (
        "the runs of a seed share the start and the data order, so the difference is the "
        "noise's alone; below the threshold the claim is one about SGD, not Langevin training "
        "(per variant, mean over seeds: "
        + ", ".join(f"{v} {mean(m):.3g}" for v, m in zip(variants, moved, strict=True))
        + ")"
    )
    return Check(name, _per_seed_mean(moved, min), at_least(required), note)


def fit_kept_check(
    experiment: Experiment, temperature: str, variants: Sequence[str], allowed: float
) -> Check:
    """Phase 2 kept the phase-1 fit: the final train RMSE over the seed's phase-1 train RMSE,
    the largest over ``variants``, mean over seeds, at most ``allowed``."""
    name = f"{FIT_CHECK} ({', '.join(variants)})"
    ratios = [
        [
            final(r, "train_rmse") / number(run["pretrained"]["train_rmse"])
            for r, run in zip(experiment.records(temperature, v), experiment.runs, strict=True)
        ]
        for v in variants
    ]
    note = (
        "a gap trend measured while the training error climbs says nothing about "
        "generalization (per variant, mean over seeds: "
        + ", ".join(f"{v} {mean(m):.3g}" for v, m in zip(variants, ratios, strict=True))
        + ")"
    )
    return Check(name, _per_seed_mean(ratios, largest), at_most(allowed), note)


__all__ = [
    "FIT_CHECK",
    "OUTCOME_CHECK",
    "OVERFIT_CHECK",
    "RUN_LENGTH_CHECK",
    "acted_check",
    "fit_kept_check",
    "noise_acted",
    "outcome_moved_check",
    "overfit_check",
    "run_length_check",
]
