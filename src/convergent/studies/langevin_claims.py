"""The `langevin` study's claims (designs 2 to 6), scored from a ``results.json`` payload alone.

The study tests each claim in its own form, in a regime that a phase-1 pilot showed can overfit
(``data["regime"]``). Per experiment (``attention``: W_Q and W_K; ``lora``: the LoRA factors A
and B) five claims, each with one number per seed (the runs of one seed share the pre-trained
model, the data order and the noise draws):

1. bounded, at ``bound_temperature``: max over log/power and the matrices of
   max(peak over the second half, upper end of the fitted asymptote's interval) / stationary
   radius - 1; holds if <= ``bound_tolerance``.
2. grows, at the same temperature: the unregularized total norm's end / start - 1; holds if
   >= ``growth_threshold``.
3. the gap does not creep up with a regularizer: the larger gap trend of log and power over
   the phase-1 test RMSE; holds if <= ``gap_margin``.
4. the gap creeps up without one: the unregularized gap trend over the phase-1 test RMSE;
   holds if >= ``gap_margin``.
5. accuracy not worse (one-sided): the larger relative excess of the final test RMSE with log
   or power over the unregularized run's; holds if <= ``accuracy_margin``.

Design 2 tests 3-5 at one ``claim_temperature``; designs 3 to 5 at each of
``claim_temperatures`` (design 4 differs from 3 only in how lam is selected). Design 5 scores
claim 1 against the penalty-only chain of the same seed (`langevin_null`): the statistic
minus the chain's, at most ``bound_tolerance``. Design 6 scores it on the matrices' joint norm
(`langevin_null.joint_excess`, at most ``bound_tolerance``), gated by the same statistic of the
chains being within the tolerance too.

Manipulation checks: the runs lasted ``relaxation_multiple`` relaxation times (1); the
regularizer acted, its end norm at most 0.9 of the unregularized run's (1, 3, 5); the noise
acted, sqrt(lr s) / (lr RMS grad V) >= 0.1 on the unregularized run (1-4); the regime can
overfit, the pilot's validation / train RMSE at least its declared minimum (3, 4). Design 3
adds, for 3-5: the noise changed the outcome, the final test RMSE at s differing from the same
seed's s = 0 run by at least ``outcome_moved`` of the phase-1 test RMSE in every variant the
claim reads (design 2's calibrated runs matched s = 0 to 4 digits: its gap and accuracy claims
were SGD's); and for 3-4: phase 2 kept the phase-1 fit, the final train RMSE at most
``fit_kept`` x the phase-1 train RMSE in every variant read. A claim whose variant or
temperature did not run is left out.

Payloads without ``data["design"]`` in `DESIGNS` are scored by `langevin_claims_v1`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.regularize import diffusion_radius
from convergent.studies import langevin_claims_v1 as v1
from convergent.studies.framework.claims import (
    Check,
    Claim,
    at_least,
    at_most,
    claim_from_seeds,
    format_number,
)
from convergent.studies.framework.claims import stored_number as number
from convergent.studies.langevin_checks import (
    FIT_CHECK,
    OUTCOME_CHECK,
    OVERFIT_CHECK,
    RUN_LENGTH_CHECK,
    acted_check,
    fit_kept_check,
    noise_acted,
    outcome_moved_check,
    overfit_check,
    run_length_check,
)
from convergent.studies.langevin_measures import (
    NOISE_CHECK,
    Bound,
    Experiment,
    bound_of,
    final,
    gap_trend,
    growth,
    largest,
    mean,
    noise_check,
    noise_to_drift_ratio,
    phase2_table,
    temperature_rows,
    total_end_norm,
    total_norm,
)
from convergent.studies.langevin_null import has_nulls, joint_bounded_claim, null_bounded_claim

DESIGN = 6
DESIGNS = (2, 3, 4, 5, 6)
TARGETS = v1.TARGETS
ACTED_AT_MOST = v1.ACTED_AT_MOST


def _fitted_asymptote(bound: Bound) -> float:
    """The largest asymptote / r over the matrices whose fit converged (NaN if none did)."""
    fitted = [value for value in bound.asymptote.values() if not math.isnan(value)]
    return max(fitted) if fitted else math.nan


def _per_seed_worst(values: Sequence[Sequence[float]]) -> list[float]:
    """Per seed, the worst (largest) over the penalties: the claim is about every one."""
    return [largest(seed) for seed in zip(*values, strict=True)]


def bounded_claim(
    experiment: Experiment, temperature: str, tolerance: float, checks: Sequence[Check]
) -> Claim:
    """Claim 1: with log or power the norms stay within ``tolerance`` of the stationary radius."""
    bounds: dict[str, list[Bound]] = {
        p: [bound_of(r) for r in experiment.records(temperature, p)]
        for p in experiment.penalties(temperature)
    }
    parts, unfitted, curves = [], 0, 0
    for p, seeds in bounds.items():
        records = experiment.records(temperature, p)
        radii = [r for b in seeds for r in b.radius.values()]
        peak = mean([largest(list(b.peak.values())) for b in seeds])
        asymptote = mean([_fitted_asymptote(b) for b in seeds])
        relaxation = mean([number(r["relaxation_steps"]) for r in records])
        steps = mean([number(r["steps"]) for r in records])
        parts.append(
            f"{p}: peak / r {format_number(peak)}, asymptote / r {format_number(asymptote)} "
            f"(r {min(radii):.3g} to {max(radii):.3g}), relaxation {format_number(relaxation)} "
            f"steps, run {format_number(steps)} steps"
        )
        unfitted += sum(len(b.unfitted) for b in seeds)
        curves += sum(len(b.peak) for b in seeds)
    fits = (
        f" The saturation fit failed for {unfitted} of {curves} (seed, matrix) curves; those "
        "are judged by their peak alone."
        if unfitted
        else ""
    )
    return claim_from_seeds(
        f"{experiment.name}: with a light log or power regularizer, the norms of "
        f"{experiment.what} stay bounded (here: {experiment.where(temperature)}, every "
        "matrix's peak over the second half of phase 2 and the upper end of its fitted "
        f"asymptote's 95 % interval stay within {v1._percent(tolerance)} of the penalty's "
        "stationary radius r)",
        _per_seed_worst([[b.excess for b in seeds] for seeds in bounds.values()]),
        at_most(tolerance),
        unit="largest (peak or asymptote) / r - 1 over log/power and the matrices",
        checks=checks,
        evidence="Mean over seeds of the largest ratio over the matrices: "
        + "; ".join(parts)
        + f"; bounded means at most {v1._percent(tolerance)} above r."
        + fits,
    )


def grows_claim(experiment: Experiment, temperature: str, threshold: float, noisy: Check) -> Claim:
    """Claim 2: without a regularizer the total norm ends ``threshold`` above its start."""
    records = experiment.records(temperature, "none")
    s = experiment.temperatures[temperature]
    ends = [total_end_norm(r) for r in records]
    predicted = [
        diffusion_radius(
            total_norm(r["trace"][0]["norms"]),
            sum(int(n) for n in r["numel"].values()),
            s,
            time=number(r["steps"]) * experiment.lr,
        )
        for r in records
    ]
    ratios = [end / p for end, p in zip(ends, predicted, strict=True)]
    return claim_from_seeds(
        f"{experiment.name}: without a regularizer, the norms of {experiment.what} grow "
        f"(here: {experiment.where(temperature)}, the total norm of the targeted matrices ends "
        f"at least {v1._percent(threshold)} above its start)",
        [growth(r) for r in records],
        at_least(threshold),
        unit="relative growth of the total norm without regularizer (end / start - 1)",
        checks=[noisy],
        evidence=f"Mean total end norm {format_number(mean(ends))} against "
        f"{format_number(mean(predicted))} from pure diffusion, sqrt(start^2 + numel s t) "
        f"(observed / predicted, mean over seeds, {format_number(mean(ratios))}; near 1 the "
        "growth is the noise's alone; reported, not a criterion).",
        extra={"observed_over_diffusion": ratios},
    )


def relative_gap_trends(experiment: Experiment, temperature: str, variant: str) -> list[float]:
    """`gap_trend` of ``variant`` over the seed's phase-1 test RMSE, one per seed: the gap
    claims' scale, so that one margin serves both experiments."""
    records = experiment.records(temperature, variant)
    return [gap_trend(r) / p for r, p in zip(records, experiment.pretrained_test, strict=True)]


def _gap_evidence(experiment: Experiment, temperature: str) -> str:
    trends = ", ".join(
        f"{v} {mean(relative_gap_trends(experiment, temperature, v)):+.2%}"
        for v in experiment.variants
        if experiment.has(temperature, v)
    )
    return (
        f"Mean gap trend over phase 2 (least-squares change) / phase-1 test RMSE: {trends}; "
        f"phase-1 test RMSE, mean over seeds, {format_number(mean(experiment.pretrained_test))}."
    )


def gap_bounded_claim(
    experiment: Experiment, temperature: str, margin: float, checks: Sequence[Check]
) -> Claim:
    """Claim 3: with log and with power the gap's trend stays below ``margin`` of the phase-1
    test RMSE."""
    trends = [
        relative_gap_trends(experiment, temperature, p) for p in experiment.penalties(temperature)
    ]
    return claim_from_seeds(
        f"{experiment.name}: with a light log or power regularizer, the generalization gap does "
        f"not creep up (here: {experiment.where(temperature)}, its least-squares trend over "
        f"phase 2 stays below {v1._percent(margin)} of the phase-1 test RMSE with log and with "
        "power)",
        _per_seed_worst(trends),
        at_most(margin),
        unit="gap trend / phase-1 test RMSE (the larger of log and power)",
        checks=checks,
        evidence=_gap_evidence(experiment, temperature),
    )


def gap_creeps_claim(
    experiment: Experiment, temperature: str, margin: float, checks: Sequence[Check]
) -> Claim:
    """Claim 4: without a regularizer the gap's trend reaches ``margin`` of the phase-1 test
    RMSE."""
    return claim_from_seeds(
        f"{experiment.name}: without a regularizer, the generalization gap creeps up (here: "
        f"{experiment.where(temperature)}, its least-squares trend over phase 2 is at least "
        f"{v1._percent(margin)} of the phase-1 test RMSE)",
        relative_gap_trends(experiment, temperature, "none"),
        at_least(margin),
        unit="gap trend / phase-1 test RMSE without regularizer",
        checks=checks,
        evidence=_gap_evidence(experiment, temperature),
    )


def not_worse_claim(
    experiment: Experiment,
    temperature: str,
    margin: float,
    labels_std: float,
    checks: Sequence[Check],
) -> Claim:
    """Claim 5 (one-sided): with log or power the final test RMSE is at most ``margin`` above
    the unregularized run's, paired by seed."""
    finals = {
        v: [final(r, "test_rmse") for r in experiment.records(temperature, v)]
        for v in experiment.variants
        if experiment.has(temperature, v)
    }
    excess = {
        p: [(f - n) / n for f, n in zip(finals[p], finals["none"], strict=True)]
        for p in experiment.penalties(temperature)
    }
    shown = ", ".join(
        f"{v} {format_number(mean(f))} ({format_number(mean(f) * labels_std)} raw)"
        for v, f in finals.items()
    )
    return claim_from_seeds(
        f"{experiment.name}: prediction accuracy is about the same with or without a "
        f"regularizer (here: one-sided, {experiment.where(temperature)}, the final test RMSE "
        f"with log or power at most {v1._percent(margin)} above the unregularized run's)",
        _per_seed_worst(list(excess.values())),
        at_most(margin),
        unit="relative excess of the final test RMSE over none's (the larger of log and power)",
        checks=checks,
        evidence=f"Mean final test RMSE, standardized (raw units): {shown}.",
        paired=True,
        extra={"relative_difference": excess},
    )


def claim_temperatures(config: Mapping[str, Any], design: int) -> list[str]:
    """Where the gap and accuracy claims are tested: design 2's one temperature, or design 3's
    list."""
    if design == 2:
        return [str(config["claim_temperature"])]
    return [str(name) for name in config["claim_temperatures"]]


def experiment_claims(
    experiment: Experiment, config: Mapping[str, Any], data: Mapping[str, Any]
) -> list[Claim]:
    """Claims 1-5 of one experiment, leaving out those whose variant or temperature is missing."""
    design = int(data["design"])
    bound = str(config["bound_temperature"])
    overfit = overfit_check(data)
    claims: list[Claim] = []
    if experiment.penalties(bound):
        checks = [
            run_length_check(experiment, bound, number(config["relaxation_multiple"])),
            acted_check(experiment, bound),
            noise_acted(experiment, bound),
        ]
        tolerance = number(config["bound_tolerance"])
        if design >= 6:
            claims.append(joint_bounded_claim(experiment, bound, tolerance, checks))
        elif design == 5 and has_nulls(experiment.runs, experiment.penalties(bound)):
            claims.append(null_bounded_claim(experiment, bound, tolerance, checks))
        else:
            claims.append(bounded_claim(experiment, bound, tolerance, checks))
    if experiment.has(bound, "none"):
        growth_threshold = number(config["growth_threshold"])
        claims.append(
            grows_claim(experiment, bound, growth_threshold, noise_acted(experiment, bound))
        )
    for claim in claim_temperatures(config, design):
        claims.extend(gap_and_accuracy_claims(experiment, claim, config, data, overfit))
    return claims


def gap_and_accuracy_claims(
    experiment: Experiment,
    temperature: str,
    config: Mapping[str, Any],
    data: Mapping[str, Any],
    overfit: Check,
) -> list[Claim]:
    """Claims 3-5 at one temperature. They are about Langevin training: where its noise does
    not act (or, from design 3, does not change the outcome), the run is plain SGD and they are
    untested."""
    design, margin = int(data["design"]), number(config["gap_margin"])

    def design_3_checks(variants: Sequence[str], gap: bool) -> list[Check]:
        if design < 3:
            return []
        checks = [
            outcome_moved_check(experiment, temperature, variants, number(config["outcome_moved"]))
        ]
        if gap:
            checks.append(
                fit_kept_check(experiment, temperature, variants, number(config["fit_kept"]))
            )
        return checks

    penalties = experiment.penalties(temperature)
    has_none = experiment.has(temperature, "none")
    claims: list[Claim] = []
    if penalties:
        checks = [
            overfit,
            acted_check(experiment, temperature),
            noise_acted(experiment, temperature),
            *design_3_checks(penalties, gap=True),
        ]
        claims.append(gap_bounded_claim(experiment, temperature, margin, checks))
    if has_none:
        checks = [overfit, noise_acted(experiment, temperature), *design_3_checks(["none"], True)]
        claims.append(gap_creeps_claim(experiment, temperature, margin, checks))
    if penalties and has_none:
        acted = acted_check(experiment, temperature)
        claims.append(
            not_worse_claim(
                experiment,
                temperature,
                number(config["accuracy_margin"]),
                number(data["labels_std"]),
                [acted, *design_3_checks(["none", *penalties], gap=False)],
            )
        )
    return claims


def experiments(config: Mapping[str, Any], data: Mapping[str, Any]) -> list[Experiment]:
    """The experiments that ran, in `TARGETS` order."""
    temperatures = {name: number(s) for name, s in data["temperatures"].items()}
    return [
        Experiment(
            name,
            what,
            data["runs"][name],
            list(config["variants"]),
            temperatures,
            number(config["langevin_lr"]),
        )
        for name, what in TARGETS.items()
        if data["runs"].get(name)
    ]


def claims_from_results(results: Mapping[str, Any]) -> list[Claim]:
    """Every claim from ``results["config"]`` and ``results["data"]`` (JSON) alone; a payload
    of design 1 (no ``data["design"]`` in `DESIGNS`) is scored by `langevin_claims_v1`."""
    config, data = results["config"], results["data"]
    if data.get("design") not in DESIGNS:
        return v1.claims_from_results(dict(results))
    return [
        claim for e in experiments(config, data) for claim in experiment_claims(e, config, data)
    ]


__all__ = [
    "DESIGN",
    "DESIGNS",
    "FIT_CHECK",
    "NOISE_CHECK",
    "OUTCOME_CHECK",
    "OVERFIT_CHECK",
    "RUN_LENGTH_CHECK",
    "Experiment",
    "acted_check",
    "claim_temperatures",
    "claims_from_results",
    "fit_kept_check",
    "noise_check",
    "noise_to_drift_ratio",
    "outcome_moved_check",
    "overfit_check",
    "phase2_table",
    "relative_gap_trends",
    "run_length_check",
    "temperature_rows",
]
