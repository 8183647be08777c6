"""What the ``langevin`` study's claims measure in its stored phase-2 runs (the manipulation
checks that gate them are in :mod:`.checks`).

A run record is ``data["runs"][experiment][seed]["phase2"][temperature][variant]``: ``lam``,
``steps``, ``relaxation_steps`` (the penalty's radial relaxation time, in steps), per-matrix
``stationary_radius`` and ``numel``, and a ``trace`` of evaluations ``{step, norms: {matrix:
||W||_F}, train_rmse, validation_rmse, test_rmse, gap, grad_rms}``. Every number is read
through `stored_number`: JSON keeps inf and NaN as strings, or as None.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.diagnostics import fit_saturation
from convergent.regularize import PENALTIES
from convergent.studies.framework import stored_number as number

Record = Mapping[str, Any]


def noise_to_drift_ratio(lr: float, s: float, gradient_rms: float) -> float:
    """The Langevin noise move per step over the gradient move, both as RMS per entry: a step
    T <- T - lr * grad V + sqrt(lr * s) * xi moves each entry by sqrt(lr * s) (the noise) and
    lr * gradient_rms (the drift); inf for a zero gradient."""
    if lr <= 0 or s < 0 or gradient_rms < 0:
        raise ValueError(
            f"need lr > 0, s >= 0 and gradient_rms >= 0, got {lr!r}, {s!r}, {gradient_rms!r}"
        )
    drift = lr * gradient_rms
    return math.sqrt(lr * s) / drift if drift > 0 else math.inf


def mean_noise_ratio(trace: Sequence[Record], lr: float, s: float) -> float:
    """`noise_to_drift_ratio` averaged over a trace's records after step 0 (NaN where a record
    has no gradient RMS or there is none)."""
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
    return total_norm(record["trace"][-1]["norms"])


def growth(record: Record) -> float:
    """The total norm's end / start - 1."""
    return total_end_norm(record) / total_norm(record["trace"][0]["norms"]) - 1.0


def final(record: Record, key: str) -> float:
    """``key`` (e.g. ``test_rmse``) in the run's last evaluation."""
    return number(record["trace"][-1][key])


def last_step(record: Record) -> float:
    return number(record["trace"][-1]["step"])


def evaluation_at(record: Record, step: float) -> Mapping[str, Any] | None:
    """The run's evaluation at ``step`` (None where it has none)."""
    return next((r for r in record["trace"] if number(r["step"]) == step), None)


def change_from_zero(record: Record, zero: Record, key: str = "test_rmse") -> float:
    """``key`` of ``record`` minus the same seed's s = 0 run's, both read at the s = 0 run's
    last step (at the bound temperature the noisy run lasts longer; NaN where it has none)."""
    found = evaluation_at(record, last_step(zero))
    return (number(found[key]) if found is not None else math.nan) - final(zero, key)


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
    """The upper end of the 95 % interval of the asymptote A of v_t = A - C exp(-k t) fitted
    to ``curve`` (one norm per evaluation at ``steps``); NaN where the fit raises or its end is
    not finite, and for a curve that ends no higher than it starts: the asymptote is there to
    catch a norm still rising, and a falling curve's undetermined asymptote (intervals up to
    ~1e7) would call a shrinking norm unbounded. Its peak decides."""
    if len(curve) and not curve[-1] > curve[0]:
        return math.nan
    return _fitted_ceiling(tuple(map(float, curve)), tuple(map(float, steps)))


# A results.json is scored several times in one process (claims, summary, brief, advice, each
# re-scoring it); the 260 curve fits of a full langevin run are most of that time.
@functools.lru_cache(maxsize=8192)
def _fitted_ceiling(curve: tuple[float, ...], steps: tuple[float, ...]) -> float:
    try:
        ceiling = fit_saturation(list(curve), steps=list(steps)).floor_high
    except ValueError:
        return math.nan
    return ceiling if math.isfinite(ceiling) else math.nan


@dataclass(frozen=True)
class Bound:
    """How high one regularized run's norms go, per matrix, over r (its stationary radius): the
    largest norm over the second half (``peak``) and `saturation_ceiling` (``asymptote``)."""

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
    """`Bound` of one regularized run (the peak misses a norm still rising at the end; the
    fitted asymptote's upper end catches it)."""
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
    """One experiment's stored runs (one per seed) and the settings its claims read: its name,
    the targeted matrices in words, the config's variants, s per temperature, the step size."""

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
        return [run["phase2"][temperature][variant] for run in self.runs]

    def penalties(self, temperature: str) -> list[str]:
        """The regularized variants that ran at ``temperature``."""
        return [p for p in PENALTIES if self.has(temperature, p)]

    def where(self, temperature: str) -> str:
        return f"at the {temperature} temperature, s = {self.temperatures[temperature]:.3g}"

    @property
    def pretrained_test(self) -> list[float]:
        return [number(run["pretrained"]["test_rmse"]) for run in self.runs]
