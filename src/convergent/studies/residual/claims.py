"""The ``residual`` study's claims, scored from a ``results.json`` payload alone.

The theorem is a bound, L_t <= rho^t L_0 after the right initialization, and its rate is
governed by sigma_min^2 / sigma_max^2 of the attention output. It is tested in that form, in
each step-size regime of ``config["regimes"]`` (lr, steps) and in the tuned regime (each beta
at its own selected step size), from the stored loss curves and spectra (`measures`); every
effect is one number per seed, with a t-interval over the seeds:

1. linear convergence: after the transient t0 = ``transient_fraction`` x steps, each beta > 0
   curve stays under the geometric envelope through (t0, L_t0) and (T, L_T); effect: the
   largest excess of log L_t over the envelope among the beta > 0 runs; holds if <=
   ``envelope_tolerance``.
2. faster as beta grows: the mean log-slope of each curve over a loss band common to all betas
   of the seed; effect: log(speed at the largest beta / speed at beta 0); holds if >= 0.
3. the rate bound: with r_beta the mean (sigma_min / sigma_max)^2 of beta X + Attn(X) over
   training, a lower bound speed >= c r_beta. The constant c is not one we can evaluate, so it
   is set at the largest beta (c = speed_1 / r_1) and the bound is tested at every beta in
   between; effect: min over 0 < beta < 1 of log(speed_beta / (c r_beta)); holds if >= 0.
4. sigma_min kept away from zero (first regime): log10 of the smallest sigma_min of
   beta X + Attn(X) over beta > 0 divided by that at beta = 0; holds if >= 1 (tenfold).
5. advantage grows with depth: the smallest increase, between consecutive depths, of the
   tail-mean training-loss gap beta 0 minus beta 1; holds if >= 0.

The manipulation checks: GD trained (the loss fell tenfold), softmax collapsed rank at beta 0
(claims 3 and 4), the common band spans a factor 2 (claims 2 and 3), the beta = 1 depth runs
trained (claim 5).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from convergent.studies.framework import (
    Check,
    Claim,
    at_least,
    at_most,
    check_design,
    claim_from_seeds,
    finite_mean,
    format_interval,
    not_measured,
    t_interval,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.residual.measures import (
    BROKEN_EXCESS,
    TAIL_PARTS,
    Regime,
    bound_margin,
    common_band,
    depth_gaps,
    floor_decades,
    head_and_tail_means,
    log_log_slope,
    log_ratio,
    regimes_of,
    seeds_in,
    smallest_gap_growth,
    transient_steps,
)

# The design these claims are: raise it when a claim, threshold, check or selection rule changes
# (docs/studies.md, "Design history").
DESIGN = 2

BAND_WIDTH = 2.0  # the common band must span at least a factor 2 in loss
KEPT_AWAY_DECADES = 1.0  # at least 10x the beta = 0 floor
DEPTH_GAP_GROWTH = 0.0  # the gap must not shrink from one depth to the next
TRAINED_LOSS_RATIO = 0.1  # GD lowered the loss at least tenfold
COLLAPSED_SQUARED_RATIO = 1e-3  # (sigma_min/sigma_max)^2 of Attn(X) at beta = 0
DEPTH_TRAINED_LOSS_RATIO = 0.9  # beta = 1 lowered the tail-mean training loss by >= 10 %

BAND_NAME = "the common loss band spans at least a factor 2 (smallest high/low over seeds)"
TRAINED_NAME = "GD trained: largest final/initial loss over beta > 0 runs (all seeds)"
COLLAPSE_NAME = (
    "softmax collapses rank at beta = 0: mean (sigma_min/sigma_max)^2 of Attn(X) at beta 0 "
    "(squared_ratio_mean, mean over seeds)"
)
DEPTH_TRAINED_NAME = (
    "beta = 1 runs trained: largest final/initial tail-mean train loss over depths (all seeds)"
)


def _listed(values: Sequence[float], digits: str = ".3g") -> str:
    return "[" + ", ".join(format(v, digits) for v in values) + "]"


def _listed_finite(values: Sequence[float], digits: str = ".2f") -> str:
    """``values`` as a list, each non-finite one written ``nan``."""
    return (
        "[" + ", ".join("nan" if not math.isfinite(v) else format(v, digits) for v in values) + "]"
    )


def trained_check(rows: Sequence[Mapping[str, Any]]) -> Check:
    """GD lowered the loss at least tenfold in every beta > 0 run that did not diverge."""
    required = at_most(TRAINED_LOSS_RATIO)
    residual = [row for row in rows if number(row["beta"]) > 0 and not row.get("diverged")]
    ratios = [number(r["final_loss"]) / number(r["initial_loss"]) for r in residual]
    ratios = [ratio for ratio in ratios if math.isfinite(ratio)]
    if not ratios:
        return not_measured(TRAINED_NAME, required, "no beta > 0 run with a finite loss")
    return Check(
        TRAINED_NAME,
        max(ratios),
        required,
        note="the loss fell at least tenfold, so there is a curve to fit (runs that diverged "
        "are left out here and count as R^2 = 0 in claim 1's effect)",
    )


def collapse_check(rows: Sequence[Mapping[str, Any]]) -> Check:
    """Softmax attention alone has (nearly) lost rank at beta = 0."""
    required = at_most(COLLAPSED_SQUARED_RATIO)
    zero = [row for row in rows if number(row["beta"]) == 0.0]
    if not zero:
        return not_measured(COLLAPSE_NAME, required, "no beta = 0 run")
    value = float(np.mean([number(row["squared_ratio_mean"]) for row in zero]))
    return Check(
        COLLAPSE_NAME,
        value,
        required,
        note="the regime in which residuals are claimed to matter: softmax attention alone "
        "has (nearly) lost rank",
    )


def band_check(regime: Regime) -> Check:
    """The common loss band of every seed spans at least a factor ``BAND_WIDTH``."""
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


def bound_claim(regime: Regime, tolerance: float, fraction: float, trained: Check) -> Claim:
    per_seed = [max(m.excess for m in regime.measured[s] if m.beta > 0) for s in regime.seeds]
    certified = ", ".join(
        f"{beta:g}: {finite_mean([m.certified for m in regime.at(beta)]):.5f}"
        for beta in regime.betas
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
            f"{first:g}->{second:g}: {finite_mean(values):+.3f} {format_interval(interval)}{verdict}"
        )
    speeds = ", ".join(
        f"{b:g}: {finite_mean([regime.speeds[s][b] for s in regime.seeds]):.4g}" for b in betas
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
        f"{b:g}: {finite_mean([regime.ratios(s)[b] for s in regime.seeds]):.3g}"
        for b in regime.betas
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


def floor_claim(regime: Regime, collapse: Check) -> Claim:
    per_seed = [floor_decades([m.row for m in regime.measured[s]]) for s in regime.seeds]
    floors = ", ".join(
        f"beta={b:g}: " + format(min(m.row["residual_sigma_min_min"] for m in regime.at(b)), ".2g")
        for b in regime.betas
    )
    low, high = regime.betas[0], regime.betas[-1]

    def collapsed(beta: float) -> float:
        return float(np.mean([m.row["squared_ratio_mean"] for m in regime.at(beta)]))

    return claim_from_seeds(
        "Residuals keep sigma_min away from zero where softmax collapses rank (here: the smallest "
        "sigma_min of beta X + Attn(X) at every beta > 0 at least 10x that at beta = 0)",
        per_seed,
        at_least(KEPT_AWAY_DECADES),
        unit="decades (log10 of smallest beta > 0 floor / beta = 0 floor)",
        checks=[collapse],
        evidence=f"per seed log10 ratio {_listed_finite(per_seed)}; smallest sigma_min of beta X "
        f"+ Attn(X) over training (all seeds): {floors}; Attn(X) alone: mean "
        f"(sigma_min/sigma_max)^2 = {collapsed(low):.2g} at beta = {low:g} and "
        f"{collapsed(high):.2g} at beta = {high:g}.",
    )


def depth_claim(config: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> Claim:
    """Claim 5 from the stored per-step training losses of every (depth, beta, seed) run."""
    seeds = seeds_in(config, runs)
    gaps = {seed: depth_gaps([run for run in runs if int(run["seed"]) == seed]) for seed in seeds}
    growth = [smallest_gap_growth(gaps[seed]) for seed in seeds]
    required = at_most(DEPTH_TRAINED_LOSS_RATIO)
    ratios = []
    for run in runs:
        if number(run["beta"]) == 1.0:
            initial, final = head_and_tail_means(run["losses"])
            ratios.append(final / initial if initial > 0 else math.nan)
    if ratios and all(map(math.isfinite, ratios)):
        trained = Check(
            DEPTH_TRAINED_NAME,
            max(ratios),
            required,
            note=f"initial = mean over the first {1 / TAIL_PARTS:.0%} of steps, final = over the "
            "last; a model that did not train at beta = 1 has no advantage to show",
        )
    else:
        trained = not_measured(DEPTH_TRAINED_NAME, required, "no beta = 1 run with a finite loss")
    depths = sorted({depth for seed_gaps in gaps.values() for depth in seed_gaps})
    mean_gap = {d: float(np.nanmean([gaps[s].get(d, math.nan) for s in seeds])) for d in depths}
    errors = {
        (int(r["depth"]), number(r["beta"]), int(r["seed"])): number(r.get("validation_error"))
        for r in runs
    }
    error_gap = {
        d: float(
            np.mean(
                [
                    errors.get((d, 0.0, s), math.nan) - errors.get((d, 1.0, s), math.nan)
                    for s in seeds
                ]
            )
        )
        for d in depths
    }
    pairs = []
    for low, high in itertools.pairwise(depths):
        increases = [gaps[s].get(high, math.nan) - gaps[s].get(low, math.nan) for s in seeds]
        interval = t_interval(increases)
        mean = finite_mean(increases)
        clear = interval is not None and interval[0] > 0
        pairs.append(
            f"{low}->{high}: {mean:+.3f} ({format_interval(interval)}"
            f"{', excludes zero' if clear else ''})"
        )
    return claim_from_seeds(
        "With depth, the advantage of residuals grows (here: the final training-loss gap beta 0 "
        "minus beta 1 strictly increases with depth)",
        growth,
        at_least(DEPTH_GAP_GROWTH),
        unit="training loss (nats), smallest gap increase between consecutive depths",
        checks=[trained],
        evidence="final training-loss gap (beta 0 minus beta 1; final = mean over the last "
        f"{1 / TAIL_PARTS:.0%} of steps) by depth, mean over seeds: "
        + ", ".join(f"{d}: {g:.3f}" for d, g in mean_gap.items())
        + f"; smallest increase per seed {_listed_finite(growth, '.3f')}; gap increase per depth "
        "pair, mean over seeds with its 95 % interval: "
        + "; ".join(pairs)
        + "; validation-error gaps: "
        + ", ".join(f"{d}: {g:.3f}" for d, g in error_gap.items())
        + ".",
    )


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
        trained = trained_check(rows)
        band = band_check(regime)
        claims += [
            bound_claim(regime, tolerance, fraction, trained),
            speed_claim(regime, [trained, band]),
            rate_bound_claim(regime, [trained, band, collapse_check(rows)]),
        ]
    if first is not None:
        claims.append(floor_claim(first, collapse_check(first.rows())))
    return claims


def design_of(results: Mapping[str, Any]) -> int:
    """The design a payload was scored under: its data's ``design`` where stored; else 2 when
    its config has step-size ``regimes`` and 1 when it has not (design 1 ran one step size)."""
    if "design" in results["data"]:
        return int(results["data"]["design"])
    return 2 if "regimes" in results["config"] else 1


def claims_from_results(results: Mapping[str, Any]) -> list[Claim]:
    """Every claim from ``results["config"]`` and ``results["data"]`` alone (a new run's data,
    or a committed ``results.json``); raises a ValueError for another design's payload."""
    check_design("residual", design_of(results), DESIGN)
    config, data = results["config"], results["data"]
    claims = one_layer_claims(config, data)
    if data.get("depth_runs"):
        claims.append(depth_claim(config, data["depth_runs"]))
    return claims
