"""The ``residual`` study's claims (design 2), scored from a ``results.json`` payload alone.

The theorem is a bound, L_t <= rho^t L_0 after the right initialization, and its rate is
governed by sigma_min^2 / sigma_max^2 of the attention output. Design 2 tests it in that form,
in each step-size regime of ``config["regimes"]`` (lr, steps), from the stored loss curves and
spectra; every effect is one number per seed, with a t-interval over the seeds:

1. linear convergence: after the transient t0 = ``transient_fraction`` x steps, each beta > 0
   curve stays under the geometric envelope through (t0, L_t0) and (T, L_T)
   (`geometric_envelope`); effect: the largest excess of log L_t over the envelope among the
   beta > 0 runs; holds if <= ``envelope_tolerance``.
2. faster as beta grows: the mean log-slope of each curve over a loss band common to all betas
   of the seed (`band_log_slope`): from the lowest loss any beta has at t0 down to 1.05 x the
   highest final loss; effect: log(speed at the largest beta / speed at beta 0); holds if >= 0.
3. the rate bound: with r_beta the mean (sigma_min / sigma_max)^2 of beta X + Attn(X) over
   training, a lower bound speed >= c r_beta. The constant c is not one we can evaluate, so it
   is set at the largest beta (c = speed_1 / r_1) and the bound is tested at every beta in
   between; effect: min over 0 < beta < 1 of log(speed_beta / (c r_beta)); holds if >= 0.
4. sigma_min kept away from zero (first regime): as in design 1.
5. advantage grows with depth: as in design 1, with an interval per depth pair.

Payloads of design 1 (no ``regimes`` in the config) are scored by `residual_claims_v1`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from convergent.studies.framework import (
    Check,
    Claim,
    at_least,
    at_most,
    claim_from_seeds,
    format_interval,
    not_measured,
    t_interval,
)
from convergent.studies.framework import stored_number as number

from ..diagnostics import band_log_slope, geometric_envelope, smallest_envelope_rate
from . import residual_claims_v1 as v1

BROKEN_EXCESS = 10.0  # a run whose curve cannot be tested (diverged) counts as this excess
BAND_LOW_MARGIN = 1.05  # the band ends 5 % above the highest final loss, so every curve gets there
BAND_WIDTH = 2.0  # the common band must span at least a factor 2 in loss
BAND_NAME = "the common loss band spans at least a factor 2 (smallest high/low over seeds)"


@dataclass(frozen=True)
class Measured:
    """What the claims need from one run.

    Attributes:
        beta, seed: the run's coordinates.
        excess: the largest excess of log L_t over the geometric envelope from t0 (0 or less:
            the bound holds); ``BROKEN_EXCESS`` when the run cannot be tested.
        certified: the smallest rho with L_t <= rho^(t - t0) L_t0 for every t >= t0 (NaN when
            untestable).
        at_transient, final: L at t0 and at the end.
        squared_ratio: mean (sigma_min / sigma_max)^2 of beta X + Attn(X) over training.
        row: the summary row design 1's checks and floor claim read.
    """

    beta: float
    seed: int
    excess: float
    certified: float
    at_transient: float
    final: float
    squared_ratio: float
    row: dict[str, Any]


def transient_steps(steps: int, transient_fraction: float) -> int:
    """t0: the first step of the post-transient window."""
    return int(transient_fraction * steps)


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


def bound_margin(speeds: Mapping[float, float], ratios: Mapping[float, float]) -> float:
    """min over 0 < beta < largest of log(speed_beta / (c r_beta)), c = speed_top / r_top."""
    top = max(speeds)
    inner = [beta for beta in speeds if 0 < beta < top]
    if not inner:
        return math.nan
    return min(log_ratio(speeds[b], speeds[top]) - log_ratio(ratios[b], ratios[top]) for b in inner)


def log_log_slope(speeds: Mapping[float, float], ratios: Mapping[float, float]) -> float:
    """Least-squares slope of log(speed) on log(r) over beta > 0 (1: speed proportional to r)."""
    betas = [b for b in speeds if b > 0 and speeds[b] > 0 and ratios[b] > 0]
    if len(betas) < 2:
        return math.nan
    x = [math.log(ratios[b]) for b in betas]
    y = [math.log(speeds[b]) for b in betas]
    if np.ptp(x) == 0:
        return math.nan
    return float(stats.linregress(x, y).slope)


@dataclass(frozen=True)
class Regime:
    """One step-size regime's runs, measured, by seed.

    Attributes:
        lr, steps: full-batch GD step size (None: tuned per beta, every run kept) and step
            count.
        seeds: the seeds, in the config's order.
        runs: seed -> that seed's stored runs, sorted by beta.
        measured: seed -> the matching `Measured`.
        speeds: seed -> beta -> band speed.
    """

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
        if self.lr is None:
            return f"lr tuned per beta ({self.step_sizes()}), {self.steps} steps"
        return f"lr {self.lr:g}, {self.steps} steps"

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


def _band_check(regime: Regime) -> Check:
    widths = []
    for seed in regime.seeds:
        high, low = common_band(regime.measured[seed])
        widths.append(high / low if math.isfinite(high) and low > 0 else math.nan)
    required = at_least(BAND_WIDTH)
    if not widths or not all(map(math.isfinite, widths)):
        return not_measured(BAND_NAME, required, "a loss at t0 or at the end is not finite")
    return Check(
        BAND_NAME,
        min(widths),
        required,
        note="the band runs from the lowest loss any beta has at t0 (so every curve enters it "
        "after its transient) to 1.05 x the highest final loss (so every curve leaves it)",
    )


def _listed(values: Sequence[float], digits: str = ".3g") -> str:
    return "[" + ", ".join(format(v, digits) for v in values) + "]"


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def bound_claim(regime: Regime, tolerance: float, fraction: float, trained: Check) -> Claim:
    per_seed = [max(m.excess for m in regime.measured[s] if m.beta > 0) for s in regime.seeds]
    certified = ", ".join(
        f"{beta:g}: {_mean([m.certified for m in regime.at(beta)]):.5f}" for beta in regime.betas
    )
    zero = [m.excess for m in regime.at(0.0)]
    broken = sum(value > tolerance for value in zero)
    t0 = transient_steps(regime.steps, fraction)
    return claim_from_seeds(
        f"Full-batch GD on a one-layer Transformer with residual connections converges linearly "
        f"({regime.name}; here: after a transient of {t0} steps every beta > 0 curve stays "
        "under the geometric bound L_t <= rho^(t - t0) L_t0 through its window's ends)",
        per_seed,
        at_most(tolerance),
        unit="largest log excess over the geometric envelope (beta > 0 runs)",
        checks=[trained],
        evidence=f"largest excess per seed {_listed(per_seed)} (a diverged run counts as "
        f"{BROKEN_EXCESS:g}); certified rate from t0 (smallest rho the curve satisfies), mean "
        f"over seeds, by beta: {certified}; at beta = 0 the bound is broken (excess > "
        f"{tolerance:g}) in {broken} of {len(zero)} runs, excesses {_listed(zero)}.",
    )


def speed_claim(regime: Regime, checks: Sequence[Check]) -> Claim:
    betas = regime.betas
    low, high = betas[0], betas[-1]
    per_seed = [log_ratio(regime.speeds[s][high], regime.speeds[s][low]) for s in regime.seeds]
    pairs = []
    for first, second in itertools.pairwise(betas):
        values = [
            log_ratio(regime.speeds[s][second], regime.speeds[s][first]) for s in regime.seeds
        ]
        interval = t_interval(values)
        verdict = ""
        if interval is not None:
            verdict = ", faster" if interval[0] > 0 else ", slower" if interval[1] < 0 else ""
        pairs.append(
            f"{first:g}->{second:g}: {_mean(values):+.3f} {format_interval(interval)}{verdict}"
        )
    speeds = ", ".join(
        f"{b:g}: {_mean([regime.speeds[s][b] for s in regime.seeds]):.4g}" for b in betas
    )
    return claim_from_seeds(
        f"Convergence speeds up as beta goes from {low:g} to {high:g} ({regime.name}; here: "
        "the mean log-slope of the loss over a loss band common to every beta is steeper at "
        f"beta = {high:g} than at beta = {low:g})",
        per_seed,
        at_least(0.0),
        unit=f"log(band speed at beta {high:g} / at beta {low:g})",
        checks=checks,
        evidence=f"band speed (-d log L / d step), mean over seeds, by beta: {speeds}; "
        "log speed ratio of neighbouring betas, mean and 95 % interval (faster/slower where the "
        "interval excludes 0): " + "; ".join(pairs) + ".",
    )


def rate_bound_claim(regime: Regime, checks: Sequence[Check]) -> Claim:
    per_seed = [bound_margin(regime.speeds[s], regime.ratios(s)) for s in regime.seeds]
    slopes = [log_log_slope(regime.speeds[s], regime.ratios(s)) for s in regime.seeds]
    ratios = ", ".join(
        f"{b:g}: {_mean([regime.ratios(s)[b] for s in regime.seeds]):.3g}" for b in regime.betas
    )
    top = regime.betas[-1]
    form = (
        "Each beta at its own tuned step size: the theorem's form (its rate carries the step "
        "size, which must shrink as sigma_max grows)."
        if regime.lr is None
        else "One step size for every beta: the theorem's rate carries the step size, so this "
        "regime's version is a side test; the tuned regime's is the theorem's form."
    )
    return claim_from_seeds(
        "The rate is governed by sigma_min^2 / sigma_max^2 of the attention output "
        f"({regime.name}; here: the lower bound speed >= c (sigma_min/sigma_max)^2, with c set "
        f"at beta = {top:g}, holds at every beta in between)",
        per_seed,
        at_least(0.0),
        unit="smallest log(speed / bound) over 0 < beta < " + f"{top:g}",
        checks=checks,
        evidence=f"mean (sigma_min/sigma_max)^2 of beta X + Attn(X) over training, by beta: "
        f"{ratios}; per seed, the slope of log speed on log (sigma_min/sigma_max)^2 over beta > "
        f"0: {_listed(slopes)} (1: speed proportional to the ratio, 0: independent of it). "
        "The constant is set from the data at the largest beta, so this tests the bound's "
        "proportionality, not its constant: a speed that depends on the ratio more weakly "
        "than linearly passes. " + form,
    )


def regimes_of(config: Mapping[str, Any], data: Mapping[str, Any]) -> list[Regime]:
    """The fixed-step regimes in the config's order, then the tuned regime (if it ran)."""
    runs = data["one_layer_runs"]
    regimes = [Regime.of(config, runs, number(lr), int(steps)) for lr, steps in config["regimes"]]
    if data.get("tuned_runs"):
        regimes.append(Regime.of(config, data["tuned_runs"], None, int(config["tuned_steps"])))
    return regimes


def one_layer_claims(config: Mapping[str, Any], data: Mapping[str, Any]) -> list[Claim]:
    """Claims 1-3 per regime, then claim 4 from the first regime."""
    tolerance = number(config["envelope_tolerance"])
    fraction = number(config["transient_fraction"])
    claims: list[Claim] = []
    first: Regime | None = None
    for regime in regimes_of(config, data):
        if not regime.seeds:
            continue
        first = first or regime
        rows = regime.rows()
        trained = v1._trained_check(rows)
        band = _band_check(regime)
        claims += [
            bound_claim(regime, tolerance, fraction, trained),
            speed_claim(regime, [trained, band]),
            rate_bound_claim(regime, [trained, band, v1._collapse_check(rows)]),
        ]
    if first is not None:
        rows = first.rows()
        sweep = v1.Sweep.of({"seeds": first.seeds}, rows)
        claims.append(v1._floor_claim(sweep, v1._collapse_check(rows)))
    return claims


def claims_from_results(results: Mapping[str, Any]) -> list[Claim]:
    """Every claim from ``results["config"]`` and ``results["data"]`` alone (a new run's data,
    or a committed ``results.json``); a design-1 payload is scored by `residual_claims_v1`."""
    config, data = results["config"], results["data"]
    if "regimes" not in config:
        return v1.claims_from_results(results)
    claims = one_layer_claims(config, data)
    if data.get("depth_runs"):
        claims.append(v1.depth_claim(config, data["depth_runs"]))
    return claims
