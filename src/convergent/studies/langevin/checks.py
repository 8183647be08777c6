"""The manipulation checks that gate the ``langevin`` study's claims, read from its stored
phase-2 runs (:mod:`.measures` reads the runs).

The noise check of every claim: the outcome the claim reads differs from the same seed's s = 0
run (same start, same data order) by at least a declared fraction; the norm for "bounded" and
"grows" (`norm_moved_check`), the final test RMSE for the gap and accuracy claims
(`outcome_moved_check`). Near a minimum the gradient vanishes, so the ratio of the noise's move
to the gradient's per step (`noise_to_drift_ratio`, reported in the tables) is large even where
the noise changes nothing; the outcome against s = 0 can fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from convergent.studies.framework import Check, Threshold, at_least, at_most, not_measured
from convergent.studies.framework import stored_number as number
from convergent.studies.langevin.measures import (
    Experiment,
    Record,
    change_from_zero,
    evaluation_at,
    final,
    largest,
    last_step,
    mean,
    smallest,
    total_end_norm,
    total_norm,
)

# The manipulation checks: each a measured quantity that shows a claim's method acted, with
# its declared threshold; a failed check makes the claim's verdict ``untested``. The
# regularizer acted: its end norm at most ACTED_AT_MOST of the unregularized run's.
ACTED_AT_MOST = 0.9
REGULARIZER_CHECK = (
    "end norm with the regularizer / without (mean over seeds; the larger ratio of log and "
    "power; all targeted matrices together)"
)
DIVERGED_CHECK = "runs read by the claim that diverged (the loss or a gradient turned non-finite)"
RUN_LENGTH_CHECK = "run steps / radial relaxation steps (shortest over seeds and penalties)"
OVERFIT_CHECK = "validation RMSE / train RMSE after phase 1 in the chosen regime (pilot)"
OUTCOME_CHECK = "|test RMSE at s - at s = 0| / phase-1 test RMSE, at the s = 0 run's last step"
NORM_CHECK = "|total norm at s - at s = 0| / at s = 0, at the s = 0 run's last step"
FIT_CHECK = "final train RMSE / phase-1 train RMSE"
# Why a noise check compares against the same seed's s = 0 run.
SAME_START = (
    "the runs of a seed share the start and the data order, so the difference is the noise's alone"
)


def acted_check(experiment: Experiment, temperature: str) -> Check:
    """The regularizer acted: the larger over penalties of the mean over seeds of
    total end norm with it / without it."""
    name = f"{REGULARIZER_CHECK}, {temperature} temperature"
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
    return Check(name, largest(list(ratios.values())), at_most(ACTED_AT_MOST), note)


def diverged_at(record: Record) -> Any | None:
    """The step at which the run diverged (its trace ends in a record marked ``diverged``), or
    None for a run that ran through."""
    last = record["trace"][-1]
    return last["step"] if last.get("diverged") else None


def diverged_checks(
    experiment: Experiment, temperature: str, variants: Sequence[str]
) -> list[Check]:
    """Nothing when no run the claim reads diverged (``variants`` at ``temperature`` and at
    s = 0, every seed); else one failed check naming them. Without it a diverged seed could
    drop out of the effect (NaN seeds are left out of it) while a check read at an earlier
    step, before the divergence, passes."""
    found = [
        f"seed {run['seed']}, {where} {variant} at step {step}"
        for where in dict.fromkeys((temperature, "zero"))
        for variant in variants
        if experiment.has(where, variant)
        for run in experiment.runs
        if (step := diverged_at(run["phase2"][where][variant])) is not None
    ]
    if not found:
        return []
    note = "a diverged run has no outcome to compare: " + "; ".join(found)
    return [Check(DIVERGED_CHECK, float(len(found)), at_most(0.0), note)]


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


def _per_variant_check(
    name: str,
    variants: Sequence[str],
    values: Sequence[Sequence[float]],
    pick: Callable[..., float],
    threshold: Threshold,
    why: str,
) -> Check:
    """A check read per variant and seed (``values[variant][seed]``): the mean over seeds of
    ``pick`` (smallest or largest) over the variants of each seed; its note says ``why`` the
    check matters and each variant's mean over seeds."""
    means = ", ".join(f"{v} {mean(m):.3g}" for v, m in zip(variants, values, strict=True))
    value = mean([pick(seed) for seed in zip(*values, strict=True)])
    return Check(name, value, threshold, f"{why} (per variant, mean over seeds: {means})")


def outcome_moved_check(
    experiment: Experiment, temperature: str, variants: Sequence[str], required: float
) -> Check:
    """The noise changed the outcome: in every variant of ``variants``, the test RMSE at
    ``temperature`` differs from the same seed's s = 0 run (same data order, same start) by at
    least ``required`` x the phase-1 test RMSE, both read at the s = 0 run's last step (the runs
    at the bound temperature last longer); the smallest over the variants, mean over seeds."""
    name = f"{OUTCOME_CHECK} ({', '.join(variants)})"
    if not all(experiment.has("zero", v) and experiment.has(temperature, v) for v in variants):
        return not_measured(name, at_least(required), "no s = 0 run to compare with")
    moved = [
        [
            abs(change_from_zero(r, z)) / p
            for r, z, p in zip(
                experiment.records(temperature, v),
                experiment.records("zero", v),
                experiment.pretrained_test,
                strict=True,
            )
        ]
        for v in variants
    ]
    return _per_variant_check(
        name,
        variants,
        moved,
        smallest,
        at_least(required),
        f"{SAME_START}; below the threshold the claim is one about SGD, not Langevin training",
    )


def norm_at(record: Record, step: float) -> float:
    """`total_norm` of the run's evaluation at ``step`` (NaN where it has none)."""
    found = evaluation_at(record, step)
    return total_norm(found["norms"]) if found is not None else math.nan


def norm_moved_check(
    experiment: Experiment, temperature: str, variants: Sequence[str], required: float
) -> Check:
    """The noise changed the norm: in every variant of ``variants``, the total norm of the
    targeted matrices at ``temperature`` differs from the same seed's s = 0 run's by at least
    ``required`` of the latter, both read at the s = 0 run's last step (the runs at the bound
    temperature last longer); the smallest over the variants, mean over seeds."""
    name = f"{NORM_CHECK} ({', '.join(variants)})"
    if not all(experiment.has("zero", v) and experiment.has(temperature, v) for v in variants):
        return not_measured(name, at_least(required), "no s = 0 run to compare with")
    moved = []
    for variant in variants:
        per_seed = []
        for r, z in zip(
            experiment.records(temperature, variant),
            experiment.records("zero", variant),
            strict=True,
        ):
            step = last_step(z)
            at_zero = total_end_norm(z)
            per_seed.append(abs(norm_at(r, step) - at_zero) / at_zero)
        moved.append(per_seed)
    if any(math.isnan(v) for seed in moved for v in seed):
        return not_measured(name, at_least(required), "no evaluation at the s = 0 run's last step")
    return _per_variant_check(
        name,
        variants,
        moved,
        smallest,
        at_least(required),
        f"{SAME_START}; below the threshold the norm is where plain SGD put it",
    )


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
    return _per_variant_check(
        name,
        variants,
        ratios,
        largest,
        at_most(allowed),
        "a gap trend measured while the training error climbs says nothing about "
        "generalization, and models that lost their fit are not 'the same'",
    )
