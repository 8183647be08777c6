"""The `langevin` study's claims (design 2), scored from a ``results.json`` payload alone.

Design 2 tests each claim in its own form, at a declared temperature, in a regime that a
phase-1 pilot showed can overfit (``data["regime"]``). Per experiment (``attention``: W_Q and
W_K; ``lora``: the LoRA factors A and B) five claims, each with one number per seed (the runs
of one seed share the pre-trained model, the data order and the noise draws):

1. bounded, at ``bound_temperature``: max over log/power and the matrices of
   max(peak over the second half, upper end of the fitted asymptote's interval) / stationary
   radius - 1; holds if <= ``bound_tolerance``.
2. grows, at the same temperature: the unregularized total norm's end / start - 1; holds if
   >= ``growth_threshold``.
3. the gap does not creep up with a regularizer, at ``claim_temperature``: the larger gap
   trend of log and power over the phase-1 test RMSE; holds if <= ``gap_margin``.
4. the gap creeps up without one, at the same temperature: the unregularized gap trend over
   the phase-1 test RMSE; holds if >= ``gap_margin``.
5. accuracy not worse (one-sided), at the same temperature: the larger relative excess of the
   final test RMSE with log or power over the unregularized run's; holds if <=
   ``accuracy_margin``.

Manipulation checks: the runs lasted ``relaxation_multiple`` relaxation times (1); the
regularizer acted, its end norm at most 0.9 of the unregularized run's (1, 3, 5); the noise
acted, sqrt(lr s) / (lr RMS grad V) >= 0.1 on the unregularized run (1, 2); the regime can
overfit, the pilot's validation / train RMSE at least its declared minimum (3, 4). A claim
whose variant or temperature did not run is left out.

Payloads without ``data["design"] == 2`` are scored by `langevin_claims_v1`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.regularize import diffusion_radius
from convergent.studies import langevin_claims_v1 as v1
from convergent.studies.claims import (
    Check,
    Claim,
    at_least,
    at_most,
    claim_from_seeds,
    format_number,
    not_measured,
)
from convergent.studies.claims import stored_number as number
from convergent.studies.langevin_measures import (
    NOISE_AT_LEAST,
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

DESIGN = 2
TARGETS = v1.TARGETS
ACTED_AT_MOST = v1.ACTED_AT_MOST
RUN_LENGTH_CHECK = "run steps / radial relaxation steps (shortest over seeds and penalties)"
OVERFIT_CHECK = "validation RMSE / train RMSE after phase 1 in the chosen regime (pilot)"


def acted_check(experiment: Experiment, temperature: str) -> Check:
    """The regularizer acted: the larger over penalties of the mean over seeds of
    total end norm with it / without it."""
    name = f"{v1.REGULARIZER_CHECK}, {temperature} temperature"
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
    return Check(name, max(ratios.values()), at_most(ACTED_AT_MOST), note)


def noise_acted(experiment: Experiment, temperature: str) -> Check:
    """The noise acted on the unregularized run at ``temperature`` (`noise_check`)."""
    if not experiment.has(temperature, "none"):
        return not_measured(NOISE_CHECK, at_least(NOISE_AT_LEAST), "no unregularized run")
    traces = [list(r["trace"]) for r in experiment.records(temperature, "none")]
    return noise_check(traces, experiment.lr, experiment.temperatures[temperature])


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
    experiment: Experiment, temperature: str, margin: float, labels_std: float, acted: Check
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
        checks=[acted],
        evidence=f"Mean final test RMSE, standardized (raw units): {shown}.",
        paired=True,
        extra={"relative_difference": excess},
    )


def experiment_claims(
    experiment: Experiment, config: Mapping[str, Any], data: Mapping[str, Any]
) -> list[Claim]:
    """Claims 1-5 of one experiment, leaving out those whose variant or temperature is missing."""
    bound, claim = str(config["bound_temperature"]), str(config["claim_temperature"])
    overfit = overfit_check(data)
    claims: list[Claim] = []
    if experiment.penalties(bound):
        checks = [
            run_length_check(experiment, bound, number(config["relaxation_multiple"])),
            acted_check(experiment, bound),
            noise_acted(experiment, bound),
        ]
        claims.append(bounded_claim(experiment, bound, number(config["bound_tolerance"]), checks))
    if experiment.has(bound, "none"):
        growth_threshold = number(config["growth_threshold"])
        claims.append(
            grows_claim(experiment, bound, growth_threshold, noise_acted(experiment, bound))
        )
    margin = number(config["gap_margin"])
    # The gap claims are about Langevin training: where its noise does not act, the run is
    # plain SGD and they are untested.
    if experiment.penalties(claim):
        checks = [overfit, acted_check(experiment, claim), noise_acted(experiment, claim)]
        claims.append(gap_bounded_claim(experiment, claim, margin, checks))
    if experiment.has(claim, "none"):
        checks = [overfit, noise_acted(experiment, claim)]
        claims.append(gap_creeps_claim(experiment, claim, margin, checks))
    if experiment.penalties(claim) and experiment.has(claim, "none"):
        claims.append(
            not_worse_claim(
                experiment,
                claim,
                number(config["accuracy_margin"]),
                number(data["labels_std"]),
                acted_check(experiment, claim),
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
    of design 1 (no ``data["design"] == 2``) is scored by `langevin_claims_v1`."""
    config, data = results["config"], results["data"]
    if data.get("design") != DESIGN:
        return v1.claims_from_results(dict(results))
    return [
        claim for e in experiments(config, data) for claim in experiment_claims(e, config, data)
    ]


__all__ = [
    "DESIGN",
    "NOISE_CHECK",
    "Experiment",
    "acted_check",
    "claims_from_results",
    "noise_check",
    "noise_to_drift_ratio",
    "overfit_check",
    "phase2_table",
    "relative_gap_trends",
    "run_length_check",
    "temperature_rows",
]
