"""The ``residual`` study's first design, kept to score payloads written before design 2.

Design 2 (`residual_claims`) tests the theorem's bound form in two step-size regimes; it
reuses this module's depth claim, sigma_min floor claim and checks. This design's claims,
scored from a ``results.json`` payload alone:

Every claim has one effect per seed, so its interval spans the seed-to-seed variance:

1. linear convergence: the smallest whole-curve R^2 over beta > 0 (a run that diverged, or
   whose upper rate bound is >= 1, counts as R^2 = 0); holds if >= 0.9.
2. rate set by sigma_min^2 / sigma_max^2: Spearman(1 - rate, mean (sigma_min/sigma_max)^2 of
   beta X + Attn(X)) over the betas; holds if >= 1 (the same order).
3. sigma_min kept away from zero: log10 of the smallest sigma_min of beta X + Attn(X) over
   beta > 0 divided by that at beta = 0; holds if >= 1 (at least tenfold).
4. speeds up with beta: Spearman(beta, 1 - rate); holds if >= 1.
5. advantage grows with depth: the smallest increase, between consecutive depths, of the
   tail-mean training-loss gap beta 0 minus beta 1; holds if >= 0.

The same function scores a new run and the committed full-mode results (3 seeds, written
before this record existed): a check whose quantity was not stored is ``not_measured``.
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

LINEAR_R_SQUARED = 0.9  # the whole-curve fit's R^2 that counts as linear
SAME_ORDER = 1.0  # Spearman of exactly 1: the two orders agree
KEPT_AWAY_DECADES = 1.0  # at least 10x the beta = 0 floor
DEPTH_GAP_GROWTH = 0.0  # the gap must not shrink from one depth to the next
TRAINED_LOSS_RATIO = 0.1  # GD lowered the loss at least tenfold
COLLAPSED_SQUARED_RATIO = 1e-3  # (sigma_min/sigma_max)^2 of Attn(X) at beta = 0
DEPTH_TRAINED_LOSS_RATIO = 0.9  # beta = 1 lowered the tail-mean training loss by >= 10 %
TAIL_PARTS = 10  # "initial" and "final" loss: means over the first and last tenth of the steps

TRAINED_NAME = "GD trained: largest final/initial loss over beta > 0 runs (all seeds)"
COLLAPSE_NAME = (
    "softmax collapses rank at beta = 0: mean (sigma_min/sigma_max)^2 of Attn(X) at beta 0 "
    "(squared_ratio_mean, mean over seeds)"
)
DEPTH_TRAINED_NAME = (
    "beta = 1 runs trained: largest final/initial tail-mean train loss over depths (all seeds)"
)


def spearman(first: Sequence[float], second: Sequence[float]) -> float:
    """Spearman's rank correlation; NaN with fewer than 2 points, a non-finite value or a
    constant sequence (no order to compare)."""
    if len(first) != len(second) or len(first) < 2:
        return math.nan
    if not all(map(math.isfinite, [*first, *second])):
        return math.nan
    if np.ptp(first) == 0 or np.ptp(second) == 0:
        return math.nan
    return float(stats.spearmanr(first, second).statistic)


def head_and_tail_means(losses: Sequence[float], parts: int = TAIL_PARTS) -> tuple[float, float]:
    """The mean loss over the first and over the last ``1 / parts`` of the steps (at least one
    step each): the "initial" and "final" training loss of a noisy minibatch curve."""
    if not losses:
        return math.nan, math.nan
    count = max(1, len(losses) // parts)  # integer division, as the study's tables use
    values = [number(v) for v in losses]
    return float(np.mean(values[:count])), float(np.mean(values[-count:]))


def fit_failed(row: Mapping[str, Any]) -> bool:
    """A run whose fit cannot count as linear: diverged, upper rate bound >= 1, or no fit."""
    rate_high, r_squared = number(row.get("rate_high")), number(row.get("r_squared"))
    return bool(row.get("diverged")) or not rate_high < 1 or not math.isfinite(r_squared)


def worst_r_squared(rows: Sequence[Mapping[str, Any]]) -> float:
    """The smallest R^2 over ``rows`` (one seed's beta > 0 runs), a failed fit counting as 0."""
    if not rows:
        return math.nan
    return min(0.0 if fit_failed(row) else number(row["r_squared"]) for row in rows)


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


def smallest_gap_growth(gaps: Mapping[int, float]) -> float:
    """min over consecutive depths of gap(next) - gap(this); NaN below two depths."""
    ordered = [gaps[depth] for depth in sorted(gaps)]
    if len(ordered) < 2:
        return math.nan
    return min(b - a for a, b in itertools.pairwise(ordered))


def _seeds(config: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> list[int]:
    present = {int(item["seed"]) for item in items}
    ordered = [int(seed) for seed in config.get("seeds", []) if int(seed) in present]
    return ordered + sorted(present - set(ordered))


def _listed(values: Sequence[float], digits: str = ".2f") -> str:
    return (
        "[" + ", ".join("nan" if not math.isfinite(v) else format(v, digits) for v in values) + "]"
    )


def _trained_check(rows: Sequence[Mapping[str, Any]]) -> Check:
    required = at_most(TRAINED_LOSS_RATIO)
    residual = [row for row in rows if number(row["beta"]) > 0 and not row.get("diverged")]
    if not all("initial_loss" in row and "final_loss" in row for row in rows):
        return not_measured(TRAINED_NAME, required, "initial_loss / final_loss were not stored")
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


def _collapse_check(rows: Sequence[Mapping[str, Any]]) -> Check:
    required = at_most(COLLAPSED_SQUARED_RATIO)
    zero = [row for row in rows if number(row["beta"]) == 0.0]
    if not zero:
        return not_measured(COLLAPSE_NAME, required, "no beta = 0 run")
    if not all("squared_ratio_mean" in row for row in zero):
        return not_measured(COLLAPSE_NAME, required, "squared_ratio_mean was not stored")
    value = float(np.mean([number(row["squared_ratio_mean"]) for row in zero]))
    return Check(
        COLLAPSE_NAME,
        value,
        required,
        note="the regime in which residuals are claimed to matter: softmax attention alone "
        "has (nearly) lost rank",
    )


@dataclass(frozen=True)
class Sweep:
    """Part (a)'s fit rows grouped by seed, each seed's rows sorted by beta.

    Attributes:
        seeds: the seeds, in the config's order.
        by_seed: seed -> that seed's rows.
        rows: every row.
    """

    seeds: list[int]
    by_seed: dict[int, list[Mapping[str, Any]]]
    rows: Sequence[Mapping[str, Any]]

    @classmethod
    def of(cls, config: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Sweep:
        seeds = _seeds(config, rows)
        by_seed = {
            seed: sorted(
                (r for r in rows if int(r["seed"]) == seed), key=lambda r: number(r["beta"])
            )
            for seed in seeds
        }
        return cls(seeds, by_seed, rows)

    @property
    def betas(self) -> list[float]:
        return sorted({number(row["beta"]) for row in self.rows})

    def series(self, seed: int, key: str) -> list[float]:
        """``key`` of one seed's runs, in the order of beta."""
        return [number(row.get(key)) for row in self.by_seed[seed]]

    def contraction(self, seed: int, key: str = "rate") -> list[float]:
        """1 - rate of one seed's runs, in the order of beta."""
        return [1.0 - rate for rate in self.series(seed, key)]

    def seed_mean(self, key: str, beta: float) -> float:
        """``key`` at ``beta``, averaged over the seeds."""
        return float(np.mean([number(r.get(key)) for r in self.rows if number(r["beta"]) == beta]))


def _linear_claim(sweep: Sweep, trained: Check) -> Claim:
    residual = [row for row in sweep.rows if number(row["beta"]) > 0]
    per_seed = [
        worst_r_squared([r for r in sweep.by_seed[s] if number(r["beta"]) > 0]) for s in sweep.seeds
    ]
    failed = sum(fit_failed(row) for row in residual)
    return claim_from_seeds(
        "Full-batch GD on a one-layer Transformer with residual connections converges linearly "
        f"(here: R^2 >= {LINEAR_R_SQUARED:g} of a log-linear fit over the whole curve, for every "
        "beta > 0)",
        per_seed,
        at_least(LINEAR_R_SQUARED),
        unit="R^2 (smallest over beta > 0)",
        checks=[trained],
        evidence=f"smallest whole-curve R^2 over beta > 0, per seed {_listed(per_seed, '.3f')}; "
        f"{failed} of {len(residual)} beta > 0 runs diverged or had an upper rate bound >= 1 "
        "(such a run counts as R^2 = 0).",
    )


def _rate_order_claim(
    sweep: Sweep, late_rates: Mapping[tuple[int, float], float], checks: Sequence[Check]
) -> Claim:
    ratio = "residual_squared_ratio_mean"
    per_seed = [spearman(sweep.contraction(s), sweep.series(s, ratio)) for s in sweep.seeds]
    plain = [
        spearman(sweep.contraction(s), sweep.series(s, "squared_ratio_mean")) for s in sweep.seeds
    ]
    effective = [
        spearman(sweep.contraction(s, "effective_rate"), sweep.series(s, ratio))
        for s in sweep.seeds
    ]
    late_text = "not stored"
    if late_rates:
        late = [
            spearman(
                [1.0 - late_rates.get((s, number(r["beta"])), math.nan) for r in sweep.by_seed[s]],
                sweep.series(s, ratio),
            )
            for s in sweep.seeds
        ]
        late_text = _listed(late)
    betas = sweep.betas
    of_means = spearman(
        [1.0 - sweep.seed_mean("rate", b) for b in betas],
        [sweep.seed_mean(ratio, b) for b in betas],
    )
    return claim_from_seeds(
        "The rate is set by sigma_min^2 / sigma_max^2 of the attention output (here: the fitted "
        "rate orders the same way across beta)",
        per_seed,
        at_least(SAME_ORDER),
        unit="Spearman rank correlation (per seed, over betas)",
        checks=checks,
        evidence=f"per seed, Spearman(1 - rate, mean (sigma_min/sigma_max)^2 of beta X + Attn(X)) "
        f"over {len(betas)} betas = {_listed(per_seed)} (Spearman of the seed means, the "
        f"earlier criterion: {of_means:.2f}); with Attn(X) alone {_listed(plain)}; with the "
        f"late-window rate {late_text}; with the effective rate (L_T/L_0)^(1/T) "
        f"{_listed(effective)} (reported, not the criterion).",
    )


def _floor_claim(sweep: Sweep, collapse: Check) -> Claim:
    per_seed = [floor_decades(sweep.by_seed[s]) for s in sweep.seeds]
    floors = ", ".join(
        f"beta={b:g}: "
        + format(
            min(
                number(r.get("residual_sigma_min_min"))
                for r in sweep.rows
                if number(r["beta"]) == b
            ),
            ".2g",
        )
        for b in sweep.betas
    )
    low, high = sweep.betas[0], sweep.betas[-1]
    return claim_from_seeds(
        "Residuals keep sigma_min away from zero where softmax collapses rank (here: the smallest "
        "sigma_min of beta X + Attn(X) at every beta > 0 at least 10x that at beta = 0)",
        per_seed,
        at_least(KEPT_AWAY_DECADES),
        unit="decades (log10 of smallest beta > 0 floor / beta = 0 floor)",
        checks=[collapse],
        evidence=f"per seed log10 ratio {_listed(per_seed)}; smallest sigma_min of beta X + "
        f"Attn(X) over training (all seeds): {floors}; Attn(X) alone: mean "
        f"(sigma_min/sigma_max)^2 = {sweep.seed_mean('squared_ratio_mean', low):.2g} at beta = "
        f"{low:g} and {sweep.seed_mean('squared_ratio_mean', high):.2g} at beta = {high:g}.",
    )


def _speed_claim(sweep: Sweep, trained: Check) -> Claim:
    per_seed = [spearman(sweep.series(s, "beta"), sweep.contraction(s)) for s in sweep.seeds]
    effective = [
        spearman(sweep.series(s, "beta"), sweep.contraction(s, "effective_rate"))
        for s in sweep.seeds
    ]
    betas = sweep.betas
    of_means = spearman(betas, [1.0 - sweep.seed_mean("rate", b) for b in betas])
    final = ", ".join(f"{b:g}: {sweep.seed_mean('final_loss', b):.4f}" for b in betas)
    return claim_from_seeds(
        "Convergence speeds up as beta goes from 0 to 1 (here: Spearman(beta, 1 - fitted rate) "
        "= 1)",
        per_seed,
        at_least(SAME_ORDER),
        unit="Spearman rank correlation (per seed, over betas)",
        checks=[trained],
        evidence=f"per seed Spearman(beta, 1 - rate) = {_listed(per_seed)} with the fitted rate "
        f"(of the seed means: {of_means:.2f}); with the effective rate {_listed(effective)}; "
        f"final loss by beta (mean over seeds): {final}.",
    )


def one_layer_claims(
    config: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    late_rows: Sequence[Mapping[str, Any]] | None,
) -> list[Claim]:
    """Claims 1-4 from the whole-curve fit rows (and the late-window rows, for the evidence)."""
    sweep = Sweep.of(config, rows)
    late_rates = {(int(r["seed"]), number(r["beta"])): number(r["rate"]) for r in late_rows or []}
    trained, collapse = _trained_check(rows), _collapse_check(rows)
    return [
        _linear_claim(sweep, trained),
        _rate_order_claim(sweep, late_rates, [trained, collapse]),
        _floor_claim(sweep, collapse),
        _speed_claim(sweep, trained),
    ]


def depth_claim(config: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> Claim:
    """Claim 5 from the stored per-step training losses of every (depth, beta, seed) run."""
    seeds = _seeds(config, runs)
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
        finite = [v for v in increases if math.isfinite(v)]
        mean = float(np.mean(finite)) if finite else math.nan
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
        + f"; smallest increase per seed {_listed(growth, '.3f')}; gap increase per depth "
        "pair, mean over seeds with its 95 % interval: "
        + "; ".join(pairs)
        + "; validation-error gaps: "
        + ", ".join(f"{d}: {g:.3f}" for d, g in error_gap.items())
        + ".",
    )


def claims_from_results(results: Mapping[str, Any]) -> list[Claim]:
    """Every claim from ``results["config"]`` and ``results["data"]`` alone (a new run's data,
    or a committed ``results.json``)."""
    config, data = results["config"], results["data"]
    fits = data["one_layer_fits"]
    claims = one_layer_claims(config, fits["full_curve"], fits.get("late_window"))
    if data.get("depth_runs"):
        claims.append(depth_claim(config, data["depth_runs"]))
    return claims
