"""What the `langevin` study's claims measure in its stored phase-2 runs.

A design-2 run record is ``data["runs"][experiment][seed]["phase2"][temperature][variant]``:
``lam``, ``steps``, ``relaxation_steps`` (the penalty's radial relaxation time, in steps),
per-matrix ``stationary_radius`` and ``numel``, and a ``trace`` of evaluations ``{step, norms:
{matrix: ||W||_F}, train_rmse, validation_rmse, test_rmse, gap, grad_rms}``. Every number is
read through `stored_number`: JSON keeps inf and NaN as strings, or as None.

The noise check is shared with design 1 (`langevin_claims_v1`): one Langevin step is
T <- T - lr * grad V + sqrt(lr * s) * xi, so the noise moves each entry by sqrt(lr * s) (RMS)
and the drift by lr * RMS(grad V); a ratio below 0.1 means the run was plain SGD.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.diagnostics import fit_saturation
from convergent.optim.langevin import implied_noise_variance
from convergent.regularize import PENALTIES
from convergent.studies.framework.claims import Check, at_least, not_measured
from convergent.studies.framework.claims import stored_number as number
from convergent.studies.langevin_report import trend

# Below this the noise is a tenth of the drift per step: the run is plain SGD.
NOISE_AT_LEAST = 0.1
NOISE_CHECK = "noise RMS per step / gradient step RMS"

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
        The mean ratio; NaN when a record has no gradient RMS (runs written before it was
        recorded) or the trace has no step after 0.
    """
    records = [r for r in trace if r["step"] > 0]  # step 0 comes before any gradient
    if not records or any(r.get("grad_rms") is None for r in records):
        return math.nan
    return statistics.fmean(noise_to_drift_ratio(lr, s, number(r["grad_rms"])) for r in records)


def noise_check(none_traces: list[list[dict[str, Any]]] | None, lr: float, s: float) -> Check:
    """The noise acted: `mean_noise_ratio` of each unregularized trace, mean over seeds.

    Args:
        none_traces: the unregularized run's trace per seed, or None when there is none.
        lr: the Langevin step size.
        s: the diffusion coefficient of those runs.

    Returns:
        The check (>= 0.1), unmeasured when a trace lacks the gradient RMS.
    """
    required = at_least(NOISE_AT_LEAST)
    if none_traces is None:
        return not_measured(NOISE_CHECK, required, "no unregularized run")
    per_seed = [mean_noise_ratio(trace, lr, s) for trace in none_traces]
    if any(math.isnan(value) for value in per_seed):
        return not_measured(NOISE_CHECK, required, "gradient RMS not stored by this run")
    note = (
        "sqrt(lr s) / (lr * RMS of the gradient of loss + regularizer over the trained entries), "
        "unregularized run, mean over the phase-2 records, then over seeds (per seed "
        + ", ".join(f"{v:.3g}" for v in per_seed)
        + "); below 0.1 the noise is a tenth of the drift per step and the run is plain SGD"
    )
    return Check(NOISE_CHECK, statistics.fmean(per_seed), required, note)


def largest(values: Sequence[float]) -> float:
    """max(values), NaN if any is NaN: max() keeps or drops a NaN depending on where it sits,
    and a diverged run must not vanish from a worst case."""
    return math.nan if any(math.isnan(v) for v in values) else max(values)


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


def gap_trend(record: Record) -> float:
    """The least-squares change of the gap over the whole trace (`langevin_report.trend`)."""
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
    def unfitted(self) -> list[str]:
        """The matrices whose saturation fit failed."""
        return [matrix for matrix, value in self.asymptote.items() if math.isnan(value)]

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


def phase2_row(records: Sequence[Record], runs: Sequence[Record], labels_std: float) -> dict:
    """Means over seeds of one (experiment, temperature, variant)'s end of phase 2.

    Args:
        records: the variant's run record per seed.
        runs: the experiment's stored run per seed (for the phase-1 test RMSE).
        labels_std: raw RMSE = standardized RMSE x this.
    """
    train = mean([final(r, "train_rmse") for r in records])
    test = mean([final(r, "test_rmse") for r in records])
    kept = [
        final(r, "test_rmse") / number(run["pretrained"]["test_rmse"])
        for r, run in zip(records, runs, strict=True)
    ]
    return {
        "seeds": len(records),
        "lam": mean([number(r["lam"]) for r in records]),
        "train RMSE": train,
        "test RMSE": test,
        "train RMSE (raw)": train * labels_std,
        "test RMSE (raw)": test * labels_std,
        "test RMSE / phase-1 test RMSE": mean(kept),
        "total end norm": mean([total_end_norm(r) for r in records]),
    }


def phase2_table(data: Mapping[str, Any], lr: float | None = None) -> list[dict[str, Any]]:
    """One row per (experiment, temperature, variant): means over seeds of the end of phase 2.

    Args:
        data: a design-2 ``results["data"]``.
        lr: the Langevin step size (``config["langevin_lr"]``); without it the rows have no
            noise / drift column (the payload's data does not store the step size).

    Returns:
        Rows with the final train and test RMSE (standardized and raw), the test RMSE over
        the phase-1 test RMSE ("keeps phase-1 accuracy" at 1), the total end norm of the
        targeted matrices, lam and, given ``lr``, the noise / drift ratio (`mean_noise_ratio`).
    """
    labels_std = number(data["labels_std"])
    rows = []
    for name, runs in data["runs"].items():
        for temperature, stored_s in data["temperatures"].items():
            s = number(stored_s)
            ran = [set(run["phase2"].get(temperature, {})) for run in runs]
            # The variants every seed ran, in the stored order.
            for variant in [
                v
                for v in (runs[0]["phase2"].get(temperature, {}) if runs else {})
                if all(v in r for r in ran)
            ]:
                records = [run["phase2"][temperature][variant] for run in runs]
                row = {"experiment": name, "temperature": temperature, "s": s, "variant": variant}
                row.update(phase2_row(records, runs, labels_std))
                if lr is not None:
                    ratios = [mean_noise_ratio(r["trace"], lr, s) for r in records]
                    row["noise / drift"] = mean(ratios)
                rows.append(row)
    return rows


def temperature_rows(
    data: Mapping[str, Any], examples: int, outputs: int = 1
) -> list[dict[str, Any]]:
    """Per temperature: s, the temperature s / 2 in loss units, and the noise variance sigma^2
    whose Gaussian-likelihood posterior s samples, beside the calibrated sigma^2 the study used.

    Args:
        data: a design-2 ``results["data"]``.
        examples: training examples N of the averaged loss.
        outputs: outputs per example averaged over by the loss.
    """
    calibrated = number(data["noise_variance"])
    return [
        {
            "temperature": name,
            "s": number(s),
            "s / 2 (loss units)": number(s) / 2,
            "implied noise variance": implied_noise_variance(number(s), examples, outputs),
            "calibrated noise variance": calibrated,
        }
        for name, s in data["temperatures"].items()
    ]


__all__ = [
    "NOISE_AT_LEAST",
    "NOISE_CHECK",
    "PENALTIES",
    "Bound",
    "Experiment",
    "bound_of",
    "final",
    "gap_trend",
    "growth",
    "largest",
    "mean",
    "mean_noise_ratio",
    "noise_check",
    "noise_to_drift_ratio",
    "phase2_row",
    "phase2_table",
    "saturation_ceiling",
    "temperature_rows",
    "total_end_norm",
    "total_norm",
]
