"""What the ``langevin`` study's claims measure in its stored phase-2 runs, and the manipulation
checks that gate them.

A run record is ``data["runs"][experiment][seed]["phase2"][temperature][variant]``: ``lam``,
``steps``, ``relaxation_steps`` (the penalty's radial relaxation time, in steps), per-matrix
``stationary_radius`` and ``numel``, and a ``trace`` of evaluations ``{step, norms: {matrix:
||W||_F}, train_rmse, validation_rmse, test_rmse, gap, grad_rms}``. Every number is read
through `stored_number`: JSON keeps inf and NaN as strings, or as None.

The noise check of every claim: the outcome the claim reads differs from the same seed's s = 0
run (same start, same data order) by at least a declared fraction; the norm for "bounded" and
"grows" (`norm_moved_check`), the final test RMSE for the gap and accuracy claims
(`outcome_moved_check`). Near a minimum the gradient vanishes, so the ratio of the noise's move
to the gradient's per step (`noise_to_drift_ratio`, reported in the tables) is large even where
the noise changes nothing; the outcome against s = 0 can fail.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.diagnostics import fit_saturation
from convergent.regularize import PENALTIES
from convergent.studies.framework import Check, at_least, at_most, not_measured
from convergent.studies.framework import stored_number as number

Record = Mapping[str, Any]


def noise_to_drift_ratio(lr: float, s: float, gradient_rms: float) -> float:
    """The Langevin noise move per step over the gradient move, both as RMS per entry.

    One step is T <- T - lr * grad V + sqrt(lr * s) * xi with xi ~ N(0, I): the noise moves
    each entry by sqrt(lr * s) (RMS), the drift by lr * gradient_rms.

    Args:
        lr: the Langevin step size, > 0.
        s: the diffusion coefficient, >= 0.
        gradient_rms: the root mean square of grad V over the trained entries, >= 0.

    Returns:
        sqrt(lr * s) / (lr * gradient_rms); inf for a zero gradient.
    """
    if lr <= 0 or s < 0 or gradient_rms < 0:
        raise ValueError(
            f"need lr > 0, s >= 0 and gradient_rms >= 0, got {lr!r}, {s!r}, {gradient_rms!r}"
        )
    drift = lr * gradient_rms
    return math.sqrt(lr * s) / drift if drift > 0 else math.inf


def mean_noise_ratio(trace: Sequence[Record], lr: float, s: float) -> float:
    """`noise_to_drift_ratio` averaged over a trace's records after step 0.

    Args:
        trace: phase-2 records with ``step`` and ``grad_rms``.
        lr: the Langevin step size, > 0.
        s: the diffusion coefficient of the run, >= 0.

    Returns:
        The mean ratio; NaN when a record has no gradient RMS or the trace has no step
        after 0.
    """
    records = [r for r in trace if r["step"] > 0]  # step 0 comes before any gradient
    if not records or any(r.get("grad_rms") is None for r in records):
        return math.nan
    return statistics.fmean(noise_to_drift_ratio(lr, s, number(r["grad_rms"])) for r in records)


def largest(values: Sequence[float]) -> float:
    """max(values), NaN if any is NaN: max() keeps or drops a NaN depending on where it sits,
    and a diverged run must not vanish from a worst case."""
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def smallest(values: Sequence[float]) -> float:
    """min(values), NaN if any is NaN (as `largest`)."""
    return math.nan if any(math.isnan(v) for v in values) else min(values)


def total_norm(norms: Mapping[str, Any]) -> float:
    """||all the matrices together||_F = sqrt(sum of their squared Frobenius norms)."""
    return math.sqrt(math.fsum(number(value) ** 2 for value in norms.values()))


def total_end_norm(record: Record) -> float:
    """`total_norm` in the run's last evaluation."""
    return total_norm(record["trace"][-1]["norms"])


def growth(record: Record) -> float:
    """The total norm's relative change over the run: end / start - 1."""
    return total_end_norm(record) / total_norm(record["trace"][0]["norms"]) - 1.0


def final(record: Record, key: str) -> float:
    """``key`` (e.g. ``test_rmse``) in the run's last evaluation."""
    return number(record["trace"][-1][key])


def last_step(record: Record) -> float:
    """The step of the run's last evaluation."""
    return number(record["trace"][-1]["step"])


def evaluation_at(record: Record, step: float) -> Mapping[str, Any] | None:
    """The run's evaluation at ``step`` (None where it has none)."""
    return next((r for r in record["trace"] if number(r["step"]) == step), None)


def value_at(record: Record, step: float, key: str) -> float:
    """``key`` in the run's evaluation at ``step`` (NaN where it has none)."""
    found = evaluation_at(record, step)
    return number(found[key]) if found is not None else math.nan


def change_from_zero(record: Record, zero: Record, key: str = "test_rmse") -> float:
    """``key`` of ``record`` minus the same seed's s = 0 run's, both read at the s = 0 run's
    last step (at the bound temperature the noisy run lasts longer)."""
    return value_at(record, last_step(zero), key) - final(zero, key)


def trend(trace: Sequence[Mapping[str, float]], key: str) -> float:
    """The least-squares slope of ``key`` against the step, times the steps the trace spans:
    the change of ``key`` that the trend explains (NaN for fewer than two records)."""
    if len(trace) < 2:
        return math.nan
    steps = [r["step"] for r in trace]
    values = [r[key] for r in trace]
    mean_step, mean_value = statistics.fmean(steps), statistics.fmean(values)
    spread = sum((x - mean_step) ** 2 for x in steps)
    slope = (
        sum((x - mean_step) * (y - mean_value) for x, y in zip(steps, values, strict=True)) / spread
    )
    return slope * (steps[-1] - steps[0])


def gap_trend(record: Record) -> float:
    """The least-squares change of the gap over the whole trace (`trend`)."""
    points = [{"step": number(r["step"]), "gap": number(r["gap"])} for r in record["trace"]]
    return trend(points, "gap")


def saturation_ceiling(curve: Sequence[float], steps: Sequence[float]) -> float:
    """The upper end of the 95 % interval of the asymptote A of v_t = A - C exp(-k t).

    Args:
        curve: one norm per evaluation.
        steps: the evaluations' steps, strictly increasing.

    Returns:
        ``fit_saturation(...).floor_high``; NaN where the fit raises (a constant curve, fewer
        than 4 finite points, no convergence) or its upper end is not finite, and for a curve
        that ends no higher than it starts: the asymptote is there to catch a norm still
        rising at the end, and a falling curve's fit has an undetermined asymptote with an
        interval up to ~1e7, which would call a shrinking norm unbounded. Its peak decides.
    """
    if len(curve) and not curve[-1] > curve[0]:
        return math.nan
    try:
        ceiling = fit_saturation(curve, steps=steps).floor_high
    except ValueError:
        return math.nan
    return ceiling if math.isfinite(ceiling) else math.nan


@dataclass(frozen=True)
class Bound:
    """How high one regularized run's norms go, as multiples of their stationary radii.

    Attributes:
        peak: matrix -> the largest norm over the second half of the trace, over r.
        asymptote: matrix -> `saturation_ceiling` of the whole trace over r (NaN where the
            fit failed: that matrix is judged by its peak alone).
        radius: matrix -> r, the penalty's stationary radius.
    """

    peak: dict[str, float]
    asymptote: dict[str, float]
    radius: dict[str, float]

    @property
    def excess(self) -> float:
        """max over matrices of max(peak, asymptote) - 1; <= tolerance means bounded."""
        highest = [
            self.peak[matrix] if math.isnan(value) else largest([self.peak[matrix], value])
            for matrix, value in self.asymptote.items()
        ]
        return largest(highest) - 1.0


def bound_of(record: Record) -> Bound:
    """`Bound` of one regularized run: the second half's peak and the fitted asymptote.

    The peak alone misses a norm still rising at the end; the asymptote's upper end catches
    it (the fit extrapolates the rise) and is conservative for a noisy curve.
    """
    trace = record["trace"]
    steps = [number(r["step"]) for r in trace]
    peak, asymptote, radius = {}, {}, {}
    for matrix, stored in record["stationary_radius"].items():
        radius[matrix] = number(stored)
        curve = [number(r["norms"][matrix]) for r in trace]
        peak[matrix] = second_half_peak(curve, steps) / radius[matrix]
        asymptote[matrix] = saturation_ceiling(curve, steps) / radius[matrix]
    return Bound(peak, asymptote, radius)


def second_half_peak(curve: Sequence[float], steps: Sequence[float]) -> float:
    """The largest value of ``curve`` from half the last step on (NaN if any there is NaN)."""
    return largest(
        [value for value, step in zip(curve, steps, strict=True) if step >= steps[-1] / 2]
    )


def mean(values: Sequence[float]) -> float:
    """The mean; NaN for no values (the tables show n/a rather than fail)."""
    return statistics.fmean(values) if values else math.nan


@dataclass(frozen=True)
class Experiment:
    """One experiment's stored runs and the settings its claims read.

    Attributes:
        name: ``attention`` or ``lora``.
        what: the targeted matrices, in words.
        runs: one stored run per seed.
        variants: the config's variants.
        temperatures: temperature name -> s.
        lr: the Langevin step size.
    """

    name: str
    what: str
    runs: Sequence[Record]
    variants: Sequence[str]
    temperatures: Mapping[str, float]
    lr: float

    def has(self, temperature: str, variant: str) -> bool:
        """Whether every seed ran ``variant`` at ``temperature``."""
        return (
            variant in self.variants
            and temperature in self.temperatures
            and bool(self.runs)
            and all(variant in run["phase2"].get(temperature, {}) for run in self.runs)
        )

    def records(self, temperature: str, variant: str) -> list[Record]:
        """The run record of ``variant`` at ``temperature``, one per seed."""
        return [run["phase2"][temperature][variant] for run in self.runs]

    def penalties(self, temperature: str) -> list[str]:
        """The regularized variants that ran at ``temperature``."""
        return [p for p in PENALTIES if self.has(temperature, p)]

    def where(self, temperature: str) -> str:
        return f"at the {temperature} temperature, s = {self.temperatures[temperature]:.3g}"

    @property
    def pretrained_test(self) -> list[float]:
        """The phase-1 test RMSE per seed: the scale of the gap claims."""
        return [number(run["pretrained"]["test_rmse"]) for run in self.runs]


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


def _per_seed_mean(values: Sequence[Sequence[float]], pick: Callable[..., float]) -> float:
    """The mean over seeds of ``pick`` (min or max) over the variants of each seed."""
    return mean([pick(seed) for seed in zip(*values, strict=True)])


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
    note = (
        "the runs of a seed share the start and the data order, so the difference is the "
        "noise's alone; below the threshold the claim is one about SGD, not Langevin training "
        "(per variant, mean over seeds: "
        + ", ".join(f"{v} {mean(m):.3g}" for v, m in zip(variants, moved, strict=True))
        + ")"
    )
    return Check(name, _per_seed_mean(moved, smallest), at_least(required), note)


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
    note = (
        "the runs of a seed share the start and the data order, so the difference is the "
        "noise's alone; below the threshold the norm is where plain SGD put it (per variant, "
        "mean over seeds: "
        + ", ".join(f"{v} {mean(m):.3g}" for v, m in zip(variants, moved, strict=True))
        + ")"
    )
    return Check(name, _per_seed_mean(moved, smallest), at_least(required), note)


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
        "generalization, and models that lost their fit are not 'the same' (per variant, mean "
        "over seeds: "
        + ", ".join(f"{v} {mean(m):.3g}" for v, m in zip(variants, ratios, strict=True))
        + ")"
    )
    return Check(name, _per_seed_mean(ratios, largest), at_most(allowed), note)
