"""The `langevin` study's claims of design 1, kept to score payloads written before design 2.

Design 2 (`langevin_claims`) tests the claims at declared temperatures, against the
penalties' stationary radii, in a regime that can overfit; it dispatches payloads without
``data["design"] == 2`` here. This design, scored from a ``results.json`` payload alone:

Per experiment (``attention``: W_Q, W_K; ``lora``: the LoRA factors A, B) four claims, each
with one number per seed (runs of one seed share the pre-trained model and the data order):

1. bounded: the largest growth over the regularized variants and the two norms, <= growth;
2. growth: the smaller growth of the two norms without a regularizer, >= growth;
3. gap: min(trend_none - gap_threshold * starting test RMSE, trend_none - max regularized
   trend), >= 0;
4. accuracy: (final test RMSE_v - final_none) / final_none for the regularized variant v whose
   mean |difference| is largest, within +-accuracy_tolerance.

Manipulation checks: A, the regularizer acted (its end norm at most 0.9 of the unregularized
run's); B, the Langevin noise acted (the noise move per step at least a tenth of the gradient
move: sqrt(lr s) / (lr * gradient RMS) >= 0.1 on the unregularized run). Runs written before
the gradient RMS was recorded leave B unmeasured, so their claims 2 and 3 are ``untested``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from convergent.regularize import PENALTIES
from convergent.studies.framework.claims import (
    Check,
    Claim,
    at_least,
    at_most,
    claim_from_seeds,
    not_measured,
    within,
)
from convergent.studies.langevin_measures import NOISE_CHECK, noise_check, noise_to_drift_ratio
from convergent.studies.langevin_report import NORM_KEYS, NORM_LABELS, summarize_trace

TARGETS = {"attention": "W_Q and W_K", "lora": "the LoRA factors A and B"}
# Below this the regularizer left the end norm within 10 % of the unregularized run's.
ACTED_AT_MOST = 0.9
REGULARIZER_CHECK = (
    "end norm with the regularizer / without (mean over seeds; the larger ratio of log and "
    "power; all targeted matrices together)"
)


def _total_end_norm(summary: dict[str, float], keys: tuple[str, ...]) -> float:
    """||all targeted matrices together||_F at the end, from the per-group norms."""
    return math.sqrt(sum(summary[f"{key}_end"] ** 2 for key in keys))


def regularizer_check(
    summaries: dict[str, list[dict[str, float]]], keys: tuple[str, ...], regularized: list[str]
) -> Check:
    """Check A: the larger (over log, power) mean over seeds of end norm_v / end norm_none."""
    if "none" not in summaries or not regularized:
        return not_measured(REGULARIZER_CHECK, at_most(ACTED_AT_MOST), "no unregularized run")
    ratios = {
        variant: statistics.fmean(
            _total_end_norm(with_v, keys) / _total_end_norm(without, keys)
            for with_v, without in zip(summaries[variant], summaries["none"], strict=True)
        )
        for variant in regularized
    }
    worst = max(ratios, key=lambda v: ratios[v])
    note = (
        "a regularizer that leaves the end norm within 10 % of the unregularized run did not "
        "act; " + ", ".join(f"{v} {r:.3f}" for v, r in ratios.items())
    )
    return Check(REGULARIZER_CHECK, ratios[worst], at_most(ACTED_AT_MOST), note)


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g} %"


def claims_from_results(results: dict[str, Any]) -> list[Claim]:
    """The study's claims from ``results["config"]`` and ``results["data"]`` (JSON) alone.

    Norm growth, gap trends and end values are recomputed from the stored phase-2 traces
    (``data["runs"][experiment][seed]["traces"][variant]``) by the code that made the
    tables, so old and new payloads are scored alike.
    """
    config, data = results["config"], results["data"]
    variants = list(config["variants"])
    regularized = [v for v in PENALTIES if v in variants]
    growth, gap, tolerance = (
        float(config["growth_threshold"]),
        float(config["gap_threshold"]),
        float(config["accuracy_tolerance"]),
    )
    lr, s = float(config["langevin_lr"]), float(data["s"])
    claims: list[Claim] = []
    for experiment, what in TARGETS.items():
        seed_runs = data["runs"][experiment]
        keys = NORM_KEYS[experiment][:2]
        summaries = {
            v: [summarize_trace(run["traces"][v], NORM_KEYS[experiment]) for run in seed_runs]
            for v in variants
        }
        acted = regularizer_check(summaries, keys, regularized)
        none_traces = [run["traces"]["none"] for run in seed_runs] if "none" in variants else None
        noisy = noise_check(none_traces, lr, s)
        claims_of = ExperimentClaims(experiment, what, summaries, keys, regularized)
        if regularized:
            claims.append(claims_of.bounded(growth, acted))
        if "none" in variants:
            claims.append(claims_of.grows(growth, noisy))
        if "none" in variants and regularized:
            claims.append(claims_of.gap_creeps(gap, [acted, noisy]))
            claims.append(claims_of.same_accuracy(tolerance, acted))
    return claims


class ExperimentClaims:
    """The four claims of one experiment, from its per-variant, per-seed trace summaries."""

    def __init__(
        self,
        experiment: str,
        what: str,
        summaries: dict[str, list[dict[str, float]]],
        keys: tuple[str, ...],
        regularized: list[str],
    ) -> None:
        self.experiment, self.what, self.summaries = experiment, what, summaries
        self.keys, self.regularized = keys, regularized

    def values(self, variant: str, name: str) -> list[float]:
        """``name`` (a summary key, e.g. ``query_growth``) of ``variant``, one per seed."""
        return [summary[name] for summary in self.summaries[variant]]

    def mean(self, variant: str, name: str) -> float:
        return statistics.fmean(self.values(variant, name))

    def _growths(self, variant: str) -> str:
        return ", ".join(
            f"{NORM_LABELS[k]} {self.mean(variant, f'{k}_growth'):+.1%}" for k in self.keys
        )

    def bounded(self, growth: float, acted: Check) -> Claim:
        per_seed = [
            max(self.values(v, f"{k}_growth")[i] for v in self.regularized for k in self.keys)
            for i in range(len(self.summaries[self.regularized[0]]))
        ]
        shown = "; ".join(f"{v}: {self._growths(v)}" for v in self.regularized)
        return claim_from_seeds(
            f"{self.experiment}: with a light log or power regularizer, the norms of {self.what} "
            f"stay bounded (here: growth over the second half of phase 2 below {_percent(growth)})",
            per_seed,
            at_most(growth),
            unit="relative growth (the largest over log/power and both norms)",
            checks=[acted],
            evidence=f"Mean growth over the second half of phase 2: {shown}; bounded means "
            f"<= {_percent(growth)}.",
        )

    def grows(self, growth: float, noisy: Check) -> Claim:
        per_seed = [
            min(values)
            for values in zip(*(self.values("none", f"{k}_growth") for k in self.keys), strict=True)
        ]
        ends = "; ".join(
            f"{v}: "
            + ", ".join(f"{NORM_LABELS[k]} {self.mean(v, f'{k}_end'):.3g}" for k in self.keys)
            for v in self.summaries
        )
        return claim_from_seeds(
            f"{self.experiment}: without a regularizer, the norms of {self.what} grow "
            f"(here: growth above {_percent(growth)})",
            per_seed,
            at_least(growth),
            unit="relative growth without regularizer (the smaller of both norms)",
            checks=[noisy],
            evidence=f"Mean growth without regularizer: {self._growths('none')} (grows means "
            f">= {_percent(growth)}); mean end norms {ends}.",
        )

    def gap_creeps(self, gap: float, checks: list[Check]) -> Claim:
        change = {v: self.values(v, "gap_change") for v in self.summaries}
        start = self.values("none", "test_rmse_start")
        per_seed = [
            min(
                change["none"][i] - gap * start[i],
                change["none"][i] - max(change[v][i] for v in self.regularized),
            )
            for i in range(len(start))
        ]
        trends = ", ".join(f"{v} {statistics.fmean(c):+.4f}" for v, c in change.items())
        return claim_from_seeds(
            f"{self.experiment}: without a regularizer, the generalization gap creeps up (here: "
            f"its trend over phase 2 exceeds {_percent(gap)} of the starting test RMSE and the "
            "regularized runs' trends)",
            per_seed,
            at_least(0.0),
            unit="RMSE (the unregularized gap trend minus the larger of its two bars)",
            checks=checks,
            evidence=f"Mean gap trend over phase 2 (least-squares change): {trends}; the bars "
            f"are {_percent(gap)} of the starting test RMSE (mean {statistics.fmean(start):.4f}) "
            "and the regularized runs' trends.",
            paired=True,
        )

    def same_accuracy(self, tolerance: float, acted: Check) -> Claim:
        final_none = self.values("none", "test_rmse_end")
        difference = {
            v: [
                (f - n) / n
                for f, n in zip(self.values(v, "test_rmse_end"), final_none, strict=True)
            ]
            for v in self.regularized
        }
        # The claim is about every regularizer: test the one furthest from the baseline.
        worst = max(difference, key=lambda v: statistics.fmean(abs(d) for d in difference[v]))
        finals = ", ".join(f"{v} {self.mean(v, 'test_rmse_end'):.4f}" for v in self.summaries)
        return claim_from_seeds(
            f"{self.experiment}: prediction accuracy is about the same with or without a "
            f"regularizer (here: final test RMSE within {_percent(tolerance)} of the "
            "unregularized run)",
            difference[worst],
            within(-tolerance, tolerance),
            unit=f"relative difference of the final test RMSE, {worst} vs none",
            checks=[acted],
            evidence=f"Mean final test RMSE: {finals}; the largest mean |difference| is "
            f"{worst}'s ({statistics.fmean(difference[worst]):+.1%}).",
            paired=True,
            extra={"relative_difference": difference},
        )


__all__ = [
    "NOISE_CHECK",
    "REGULARIZER_CHECK",
    "ExperimentClaims",
    "claims_from_results",
    "noise_check",
    "noise_to_drift_ratio",
    "regularizer_check",
]
