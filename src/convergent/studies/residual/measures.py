"""What the ``residual`` study's claims and tables measure, from the stored runs alone: per
part (a) run, `measure`; per seed, each beta's band speed over the band common to its betas
(`common_band`); `Regime` groups one regime's runs by seed with these numbers. Part (b): head
and tail means of a minibatch curve and the tail-mean loss gap beta 0 minus beta 1 by depth.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from convergent.diagnostics import band_log_slope, geometric_envelope, smallest_envelope_rate
from convergent.studies.framework import stored_number as number

BROKEN_EXCESS = 10.0  # a run whose curve cannot be tested (diverged) counts as this excess
BAND_LOW_MARGIN = 1.05  # the band ends 5 % above the highest final loss, so every curve gets there
TAIL_PARTS = 10  # "initial" and "final" loss: means over the first and last tenth of the steps


@dataclass(frozen=True)
class Measured:
    """What the claims need from one run: the largest excess of log L_t over the geometric
    envelope through (t0, L_t0) and (T, L_T) (``BROKEN_EXCESS`` when untestable), the certified
    rate (the smallest rho with L_t <= rho^(t - t0) L_t0 from t0; NaN when untestable), the
    `largest_rise`, L at t0 and at the end, the mean (sigma_min / sigma_max)^2 of
    beta X + Attn(X), and the summary row the checks and tables read."""

    beta: float
    seed: int
    excess: float
    certified: float
    rise: float
    at_transient: float
    final: float
    squared_ratio: float
    row: dict[str, Any]


def transient_steps(steps: int, transient_fraction: float) -> int:
    """t0: the first step of the post-transient window."""
    return int(transient_fraction * steps)


def largest_rise(losses: Sequence[float], start: int) -> float:
    """max over t >= t0 of log L_t - min over t0 <= s <= t of log L_s (0 for a curve that never
    rises); ``BROKEN_EXCESS`` when a loss from t0 on is not finite."""
    window = np.asarray([number(v) for v in losses[start:]], dtype=np.float64)
    if window.size == 0 or not np.all(np.isfinite(window)):
        return BROKEN_EXCESS
    logs = np.log(np.maximum(window, np.finfo(np.float64).tiny))
    return min(float(np.max(logs - np.minimum.accumulate(logs))), BROKEN_EXCESS)


def measure(run: Mapping[str, Any], transient_fraction: float) -> Measured:
    """The envelope test, certified rate and spectra summary of one stored run."""
    losses = [number(v) for v in run["losses"]]
    start = transient_steps(len(losses) - 1, transient_fraction)
    try:
        envelope = geometric_envelope(losses, start=start)
        excess = min(envelope.worst_excess, BROKEN_EXCESS)
        certified = smallest_envelope_rate(losses, start=start)
    except ValueError:  # diverged before t0, or too few usable points
        excess, certified = BROKEN_EXCESS, math.nan
    rise = BROKEN_EXCESS if run.get("diverged") else largest_rise(losses, start)
    ratio = [number(v) for v in run.get("residual_squared_ratio", [])]
    row = {
        "beta": number(run["beta"]),
        "seed": int(run["seed"]),
        "initial_loss": losses[0],
        "final_loss": losses[-1],
        "diverged": bool(run.get("diverged")),
        "residual_sigma_min_min": min(number(v) for v in run["residual_sigma_min"]),
        "squared_ratio_mean": float(np.mean([number(v) for v in run["squared_ratio"]])),
        "residual_squared_ratio_mean": float(np.mean(ratio)) if ratio else math.nan,
    }
    return Measured(
        beta=row["beta"],
        seed=int(run["seed"]),
        excess=float(excess),
        certified=float(certified),
        rise=rise,
        at_transient=losses[start] if start < len(losses) else math.nan,
        final=losses[-1],
        squared_ratio=row["residual_squared_ratio_mean"],
        row=row,
    )


def common_band(measured: Sequence[Measured]) -> tuple[float, float]:
    """(high, low) of one seed's band: the lowest loss at t0 over its betas, and 1.05 x the
    highest final loss; NaN when a loss is not finite."""
    at_transient = [m.at_transient for m in measured]
    finals = [m.final for m in measured]
    if not all(map(math.isfinite, [*at_transient, *finals])):
        return math.nan, math.nan
    return min(at_transient), BAND_LOW_MARGIN * max(finals)


def band_speeds(
    runs: Sequence[Mapping[str, Any]], measured: Sequence[Measured]
) -> dict[float, float]:
    """beta -> -(mean log-slope over the seed's common band) for one seed's runs; NaN where the
    band is empty or the curve does not cross it."""
    high, low = common_band(measured)
    speeds = {}
    for run, item in zip(runs, measured, strict=True):
        if not (math.isfinite(high) and 0 < low < high):
            speeds[item.beta] = math.nan
            continue
        slope = band_log_slope([number(v) for v in run["losses"]], high, low).slope
        speeds[item.beta] = -slope if math.isfinite(slope) else math.nan
    return speeds


def log_ratio(numerator: float, denominator: float) -> float:
    """log(numerator / denominator); NaN unless both are positive and finite."""
    if not (0 < numerator < math.inf and 0 < denominator < math.inf):
        return math.nan
    return math.log(numerator / denominator)


def smallest_step_speedup(speeds: Mapping[float, float]) -> float:
    """min over consecutive betas of log(speed at the next beta / speed at this one): below 0
    where some step up in beta slowed convergence; NaN below two betas or where a speed is
    missing."""
    ordered = [speeds[beta] for beta in sorted(speeds)]
    if len(ordered) < 2 or not all(map(math.isfinite, ordered)):
        return math.nan
    return min(log_ratio(b, a) for a, b in itertools.pairwise(ordered))


def bound_margin(speeds: Mapping[float, float], ratios: Mapping[float, float]) -> float:
    """min over 0 < beta < largest of log(speed_beta / (c r_beta)), c = speed_top / r_top."""
    top = max(speeds)
    inner = [beta for beta in speeds if 0 < beta < top]
    if not inner:
        return math.nan
    return min(log_ratio(speeds[b], speeds[top]) - log_ratio(ratios[b], ratios[top]) for b in inner)


def log_log_slope(speeds: Mapping[float, float], ratios: Mapping[float, float]) -> float:
    """Least-squares slope of log(speed) on log(r) over beta > 0 (1: speed proportional to r);
    NaN where a beta > 0 has no finite positive speed or ratio, or fewer than two betas."""
    betas = [b for b in speeds if b > 0]
    usable = all(math.isfinite(speeds[b]) and speeds[b] > 0 and ratios[b] > 0 for b in betas)
    if len(betas) < 2 or not usable:
        return math.nan
    x = [math.log(ratios[b]) for b in betas]
    y = [math.log(speeds[b]) for b in betas]
    if np.ptp(x) == 0:
        return math.nan
    return float(stats.linregress(x, y).slope)


@dataclass(frozen=True)
class Regime:
    """One step-size regime's runs (``lr`` None: tuned per beta), by seed in the config's
    order: the stored runs sorted by beta, their `Measured` and band speed by beta."""

    lr: float | None
    steps: int
    seeds: list[int]
    runs: dict[int, list[Mapping[str, Any]]]
    measured: dict[int, list[Measured]]
    speeds: dict[int, dict[float, float]]

    @classmethod
    def of(
        cls,
        config: Mapping[str, Any],
        runs: Sequence[Mapping[str, Any]],
        lr: float | None,
        steps: int,
    ) -> Regime:
        chosen = [
            r for r in runs if (lr is None or number(r["lr"]) == lr) and int(r["steps"]) == steps
        ]
        seeds = [int(s) for s in config["seeds"] if any(int(r["seed"]) == s for r in chosen)]
        fraction = number(config["transient_fraction"])
        by_seed, measured, speeds = {}, {}, {}
        for seed in seeds:
            by_seed[seed] = sorted(
                (r for r in chosen if int(r["seed"]) == seed), key=lambda r: number(r["beta"])
            )
            measured[seed] = [measure(r, fraction) for r in by_seed[seed]]
            speeds[seed] = band_speeds(by_seed[seed], measured[seed])
        return cls(lr, steps, seeds, by_seed, measured, speeds)

    @property
    def name(self) -> str:
        """The regime in a claim's name: stable across designs (the tuned regime's selected
        step sizes are in `label` and in its claims' tests, not in their names)."""
        if self.lr is None:
            return f"lr tuned per beta, {self.steps} steps"
        return f"lr {self.lr:g}, {self.steps} steps"

    @property
    def label(self) -> str:
        """The regime with the tuned regime's selected step sizes (tables and figures)."""
        if self.lr is None:
            return f"lr tuned per beta ({self.step_sizes()}), {self.steps} steps"
        return self.name

    @property
    def selected_steps(self) -> str:
        """``"step sizes selected per beta 0: 0.8, ...; "`` for the tuned regime, else empty:
        the start of its claims' tests."""
        return f"step sizes selected per beta {self.step_sizes()}; " if self.lr is None else ""

    def step_sizes(self) -> str:
        """'beta: lr' for each beta (the tuned regime's selected step sizes)."""
        first: dict[float, float] = {}
        for seed in self.seeds:
            for run in self.runs[seed]:
                first.setdefault(number(run["beta"]), number(run["lr"]))
        return ", ".join(f"{beta:g}: {lr:g}" for beta, lr in sorted(first.items()))

    @property
    def betas(self) -> list[float]:
        return sorted({m.beta for items in self.measured.values() for m in items})

    def at(self, beta: float) -> list[Measured]:
        """The measured runs at ``beta``, one per seed."""
        return [m for seed in self.seeds for m in self.measured[seed] if m.beta == beta]

    def rows(self) -> list[dict[str, Any]]:
        return [m.row for seed in self.seeds for m in self.measured[seed]]

    def ratios(self, seed: int) -> dict[float, float]:
        return {m.beta: m.squared_ratio for m in self.measured[seed]}


def regimes_of(config: Mapping[str, Any], data: Mapping[str, Any]) -> list[Regime]:
    """The fixed-step regimes in the config's order, then the tuned regime (if it ran)."""
    runs = data["one_layer_runs"]
    regimes = [Regime.of(config, runs, number(lr), int(steps)) for lr, steps in config["regimes"]]
    if data.get("tuned_runs"):
        regimes.append(Regime.of(config, data["tuned_runs"], None, int(config["tuned_steps"])))
    return regimes


def seeds_in(config: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> list[int]:
    """The seeds of ``items``: the config's, in its order, then any others, sorted."""
    present = {int(item["seed"]) for item in items}
    ordered = [int(seed) for seed in config.get("seeds", []) if int(seed) in present]
    return ordered + sorted(present - set(ordered))


def head_and_tail_means(
    losses: Sequence[float | str], parts: int = TAIL_PARTS
) -> tuple[float, float]:
    """The mean loss over the first and over the last ``1 / parts`` of the steps (at least one
    step each): the "initial" and "final" training loss of a noisy minibatch curve (stored JSON
    may write a non-finite loss as a string)."""
    if not losses:
        return math.nan, math.nan
    count = max(1, len(losses) // parts)  # integer division, as the study's tables use
    values = [number(v) for v in losses]
    return float(np.mean(values[:count])), float(np.mean(values[-count:]))


def floor_decades(rows: Sequence[Mapping[str, Any]]) -> float:
    """log10(min over beta > 0 of the smallest sigma_min of beta X + Attn(X) / that at beta 0)
    over one seed's runs; NaN without a beta = 0 run, a beta > 0 run or a positive floor."""
    zero = [number(r.get("residual_sigma_min_min")) for r in rows if number(r["beta"]) == 0.0]
    rest = [number(r.get("residual_sigma_min_min")) for r in rows if number(r["beta"]) > 0.0]
    if not zero or not rest or not zero[0] > 0 or not min(rest) > 0:
        return math.nan
    return math.log10(min(rest) / zero[0])


def depth_gaps(runs: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Tail-mean training loss at beta 0 minus at beta 1, by depth (one seed's runs)."""
    final = {
        (int(run["depth"]), number(run["beta"])): head_and_tail_means(run["losses"])[1]
        for run in runs
    }
    return {
        depth: final[(depth, 0.0)] - final[(depth, 1.0)]
        for depth in sorted({depth for depth, _ in final})
        if (depth, 0.0) in final and (depth, 1.0) in final
    }


def chance_fractions(
    runs: Sequence[Mapping[str, Any]], classes: int
) -> dict[tuple[int, float], float]:
    """(depth, beta) -> the tail-mean training loss over ln(classes), the loss of a classifier
    at chance on balanced classes, as a mean over the seeds (1: at chance)."""
    tails: dict[tuple[int, float], list[float]] = {}
    for run in runs:
        key = (int(run["depth"]), number(run["beta"]))
        tails.setdefault(key, []).append(head_and_tail_means(run["losses"])[1])
    return {
        key: float(np.mean(values)) / math.log(classes) for key, values in sorted(tails.items())
    }


def smallest_gap_growth(gaps: Mapping[int, float]) -> float:
    """min over consecutive depths of gap(next) - gap(this); NaN below two depths."""
    ordered = [gaps[depth] for depth in sorted(gaps)]
    if len(ordered) < 2:
        return math.nan
    return min(b - a for a, b in itertools.pairwise(ordered))


def worst_final_losses(rows: Sequence[dict[str, Any]]) -> dict[float, float]:
    """Step size -> its worst final training loss over the tuning rows (one per selection
    seed); inf when a run diverged from any seed (a flagged or non-finite loss)."""
    worst: dict[float, float] = {}
    for row in rows:
        lost = row["diverged"] or not np.isfinite(row["final_loss"])
        loss = np.inf if lost else float(row["final_loss"])
        worst[row["lr"]] = max(worst.get(row["lr"], -np.inf), loss)
    return worst
