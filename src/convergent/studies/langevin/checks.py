"""The manipulation checks that gate the ``langevin`` study's claims, as records, read from its
stored phase-2 runs (:mod:`.measures` reads the runs).

The noise check of every claim: the outcome the claim reads differs from the same seed's s = 0
run (same start, same data order) by at least a declared fraction; the norm for "bounded" and
"grows" (`NORM_MOVED`), the final test RMSE for the gap and accuracy claims (`OUTCOME_MOVED`).
Near a minimum the gradient vanishes, so the ratio of the noise's move to the gradient's per
step (`noise_to_drift_ratio`, reported in the tables) is large even where the noise changes
nothing; the outcome against s = 0 can fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.studies.engine import CheckSpec
from convergent.studies.framework import Check, Threshold, at_least, at_most
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

# The regularizer acted: its end norm at most ACTED_AT_MOST of the unregularized run's.
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
NO_ZERO = "no s = 0 run to compare with"


def _spec(name: str, required: Threshold, summary: str, note: str, missing: str) -> CheckSpec:
    """A check whose readings are kept as they are (a NaN reading gives a NaN value)."""
    return CheckSpec(name, required, summary, note, missing, finite="kept")


def acted_check(experiment: Experiment, temperature: str) -> Check:
    """The regularizer acted: the larger over penalties of the mean over seeds of
    total end norm with it / without it."""
    penalties = experiment.penalties(temperature)
    spec = _spec(
        f"{REGULARIZER_CHECK}, {temperature} temperature",
        at_most(ACTED_AT_MOST),
        "max",
        "a regularizer that leaves the end norm within 10 % of the unregularized run did not act; ",
        "no unregularized or regularized run",
    )
    if not penalties or not experiment.has(temperature, "none"):
        return spec.check([])
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
    shown = ", ".join(f"{p} {ratio:.3f}" for p, ratio in ratios.items())
    return spec.check([largest(list(ratios.values()))], note=spec.note + shown)


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
    note = f"the run lasts at least {multiple:g} relaxation times, so the norm can settle"
    spec = CheckSpec(RUN_LENGTH_CHECK, at_least(multiple), "min", note, "no finite relaxation time")
    return spec.check(lengths)


def overfit_check(data: Mapping[str, Any]) -> Check:
    """The regime can overfit (the pilot's ratio): else no gap can creep up."""
    regime = data.get("regime")
    if not regime:
        return _spec(OVERFIT_CHECK, at_least(1.0), "min", "", "no pilot regime stored").check([])
    note = (
        f"regime {regime['name']!r} ({regime['train_fields']} training fields, d_model "
        f"{regime['d_model']}); without room to overfit the gap cannot creep up"
    )
    spec = _spec(OVERFIT_CHECK, at_least(number(regime["overfit_required"])), "min", note, "")
    return spec.check([number(regime["overfit_ratio"])])


def _norm_moved(record: Record, zero: Record) -> float:
    """|total norm at the s = 0 run's last step - the s = 0 run's| / the s = 0 run's."""
    found = evaluation_at(record, last_step(zero))
    at_zero = total_end_norm(zero)
    at_step = total_norm(found["norms"]) if found is not None else math.nan
    return abs(at_step - at_zero) / at_zero


@dataclass(frozen=True)
class VariantCheck:
    """A check read per variant and seed (``reading(record, the same seed's s = 0 record,
    the seed's stored run)``): the mean over seeds of ``pick`` over the variants of each seed,
    held to ``form(bound)``; a NaN reading makes it not measured where ``missing_value`` says
    what is missing, and without the s = 0 runs where it reads them (``against_zero``)."""

    name: str
    form: Callable[[float], Threshold]
    pick: Callable[[Sequence[float]], float]
    why: str
    reading: Callable[[Record, Record, Record], float]
    against_zero: bool = True
    missing_value: str | None = None

    def check(
        self, experiment: Experiment, temperature: str, variants: Sequence[str], bound: float
    ) -> Check:
        name = f"{self.name} ({', '.join(variants)})"
        ran = [experiment.has("zero", v) and experiment.has(temperature, v) for v in variants]
        if self.against_zero and not all(ran):
            return _spec(name, self.form(bound), "mean", "", NO_ZERO).check([])
        zero = "zero" if self.against_zero else temperature
        values = [
            [
                self.reading(r, z, run)
                for r, z, run in zip(
                    experiment.records(temperature, v),
                    experiment.records(zero, v),
                    experiment.runs,
                    strict=True,
                )
            ]
            for v in variants
        ]
        if self.missing_value and any(math.isnan(v) for seed in values for v in seed):
            return _spec(name, self.form(bound), "mean", "", self.missing_value).check([])
        means = ", ".join(f"{v} {mean(m):.3g}" for v, m in zip(variants, values, strict=True))
        value = mean([self.pick(seed) for seed in zip(*values, strict=True)])
        note = f"{self.why} (per variant, mean over seeds: {means})"
        return Check(name, value, self.form(bound), note)


OUTCOME_MOVED = VariantCheck(
    OUTCOME_CHECK,
    at_least,
    smallest,
    f"{SAME_START}; below the threshold the claim is one about SGD, not Langevin training",
    lambda r, z, run: abs(change_from_zero(r, z)) / number(run["pretrained"]["test_rmse"]),
)
NORM_MOVED = VariantCheck(
    NORM_CHECK,
    at_least,
    smallest,
    f"{SAME_START}; below the threshold the norm is where plain SGD put it",
    lambda r, z, _: _norm_moved(r, z),
    missing_value="no evaluation at the s = 0 run's last step",
)
FIT_KEPT = VariantCheck(
    FIT_CHECK,
    at_most,
    largest,
    "a gap trend measured while the training error climbs says nothing about "
    "generalization, and models that lost their fit are not 'the same'",
    lambda r, z, run: final(r, "train_rmse") / number(run["pretrained"]["train_rmse"]),
    against_zero=False,
)
outcome_moved_check = OUTCOME_MOVED.check
norm_moved_check = NORM_MOVED.check
fit_kept_check = FIT_KEPT.check
