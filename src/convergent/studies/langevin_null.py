"""The ``langevin`` study's null for "bounded" (designs 5 and 6): the penalty alone, run by the same
chain.

Designs 2 to 4 judged "bounded" by each matrix's peak norm over the second half of phase 2 (and
the upper end of a saturating fit's asymptote), over the penalty's stationary radius r: at most
10 % above it. Run in the theory's own setting (Langevin on the penalty alone, with the run's
lam, s, step size, length, start norms and record spacing), that statistic reads +0.16 to +0.23
for the log penalty on LoRA's 64-entry matrices and +0.11 to +0.22 for the power one (design 4's
five seeds; ``python examples/langevin_bound_null.py``): a norm's stationary spread is about r /
sqrt(2 n), and the peak of some fifteen records over eight matrices lies about two spreads up.
The criterion could not pass where the theory holds exactly. Design 5 measures each run against
that chain, same seed: the effect is the run's statistic minus the chain's, and "bounded" holds
if it is at most the tolerance.

Design 5's LoRA verdict was decided by one fit: on seed 9 a single 64-entry matrix's saturating
fit put its asymptote's upper end at 6.3e4 r (its chain's fits reached 3.3 r and 12.2 r on seed
6), so the mean over seeds was 1.3e4 with an interval of +-3.6e4. A fit through one small
matrix's noisy, already flat curve does not identify an asymptote. Design 6 (declared before its
run, on new seeds 10-14) takes the statistic of the targeted matrices together: their joint norm
sqrt(sum ||W||_F^2) over sqrt(sum r^2), max of its peak over the second half and the upper end
of its saturating fit's asymptote interval, minus 1 (`joint_excess`). The joint curve's
stationary spread is about sqrt(matrices) times smaller, so its fit is identified; on design 5's
stored runs and chains (read before design 6 was declared) no joint fit diverged, the chains
read -0.02 to +0.10 and the runs at most +0.06: design 6 was shaped with those numbers in view,
so only its fresh seeds decide its verdict. Any one matrix's norm is at most the joint norm, so
a joint bound bounds each matrix, but a single matrix drifting by some percent moves the joint
statistic less: the largest per-matrix peak, run minus chain, is kept in the evidence. The claim
is the joint statistic itself at most the tolerance, the issue's own form (the norm below r plus
a tolerance, the asymptote's interval below it), gated by a check that the same statistic of the
penalty-only chain is within the tolerance on every seed and penalty: where the theory holds
exactly, the criterion must pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from convergent.optim.langevin import Langevin
from convergent.regularize import Penalty, penalty
from convergent.studies.framework.claims import (
    Check,
    Claim,
    at_most,
    claim_from_seeds,
    format_number,
    not_measured,
)
from convergent.studies.framework.claims import stored_number as number
from convergent.studies.langevin_measures import (
    Experiment,
    Record,
    bound_of,
    largest,
    mean,
    saturation_ceiling,
    second_half_peak,
    total_norm,
)

# The chain's seed is the run's seed plus this (its own noise, reproducible per seed).
NULL_SEED_OFFSET = 1_000_003


def penalty_chain(
    kind: Penalty,
    lam: float,
    start_norms: Mapping[str, float],
    numel: Mapping[str, int],
    *,
    s: float,
    lr: float,
    steps: int,
    every: int,
    eps: float,
    seed: int,
) -> list[dict[str, Any]]:
    """Langevin on lam x penalty alone (no loss), one flat matrix per name: the theory's setting.

    Each matrix starts in a random direction at its ``start_norms`` length; the norms are
    recorded at step 0 and every ``every`` steps, as the study's runs record theirs.

    Returns:
        The trace: {"step", "norms": {name: ||W||_F}} per record.
    """
    generator = torch.Generator().manual_seed(seed)
    matrices: dict[str, nn.Parameter] = {}
    for name, count in numel.items():
        direction = torch.randn(int(count), generator=generator, dtype=torch.float64)
        matrices[name] = nn.Parameter(direction * (float(start_norms[name]) / direction.norm()))
    optimizer = Langevin(list(matrices.values()), lr=lr, s=s, seed=seed)

    def norms() -> dict[str, float]:
        return {name: float(matrix.detach().norm()) for name, matrix in matrices.items()}

    trace = [{"step": 0, "norms": norms()}]
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        total = sum(penalty(matrix, kind, lam, eps) for matrix in matrices.values())
        torch.as_tensor(total).backward()
        optimizer.step()
        if step % every == 0:
            trace.append({"step": step, "norms": norms()})
    return trace


def null_runs(
    bound_runs: Mapping[str, Record], s: float, settings: Mapping[str, Any], seed: int
) -> dict[str, Any]:
    """Per penalty variant of the bound temperature's runs: the penalty-only chain with that
    run's lam, numel, start norms and length, and its stationary radii."""
    out: dict[str, Any] = {}
    for variant, record in bound_runs.items():
        if variant == "none":
            continue
        trace = penalty_chain(
            cast(Penalty, variant),  # the regularized variants are named after their penalty
            float(record["lam"]),
            record["trace"][0]["norms"],
            record["numel"],
            s=s,
            lr=float(settings["langevin_lr"]),
            steps=int(record["steps"]),
            every=int(settings["record_every"]),
            eps=float(settings["power_eps"]),
            seed=seed + NULL_SEED_OFFSET,
        )
        out[variant] = {"trace": trace, "stationary_radius": record["stationary_radius"]}
    return out


def null_bounded_claim(
    experiment: Experiment, temperature: str, tolerance: float, checks: Sequence[Check]
) -> Claim:
    """Claim 1 of design 5: per seed, the largest over log and power of (the run's bound
    statistic - the same seed's penalty-only chain's), at most ``tolerance``."""
    penalties = experiment.penalties(temperature)
    differences: list[list[float]] = []
    parts = []
    for p in penalties:
        runs = [bound_of(r).excess for r in experiment.records(temperature, p)]
        nulls = [bound_of(run["null"][p]).excess for run in experiment.runs]
        differences.append([run - null for run, null in zip(runs, nulls, strict=True)])
        parts.append(
            f"{p}: run {format_number(sum(runs) / len(runs))}, penalty alone "
            f"{format_number(sum(nulls) / len(nulls))}"
        )
    per_seed = [largest(list(seed)) for seed in zip(*differences, strict=True)]
    return claim_from_seeds(
        f"{experiment.name}: with a light log or power regularizer, the norms of "
        f"{experiment.what} stay bounded (here: {experiment.where(temperature)}, every "
        "matrix's peak over the second half of phase 2 and the upper end of its fitted "
        "asymptote's 95 % interval, over the penalty's stationary radius r, exceed the same "
        "statistic of the penalty alone run by the same chain (the theory's setting: same lam, "
        f"s, step, start and length) by at most {round(100 * tolerance)} % of r)",
        per_seed,
        at_most(tolerance),
        unit="largest (peak or asymptote) / r - 1, run minus penalty alone (the larger of "
        "log and power)",
        checks=checks,
        evidence="Mean over seeds of the statistic, max over the matrices of max(peak, "
        "asymptote) / r - 1: " + "; ".join(parts) + ". At exact stationarity the two agree "
        "up to the chains' noise.",
        paired=True,
        extra={"radius_excess_minus_null": dict(zip(penalties, differences, strict=True))},
    )


NULL_CRITERION_CHECK = (
    "joint statistic of the penalty-only chain (largest over seeds and penalties), the "
    "criterion in the theory's own setting"
)


def joint_excess(record: Record) -> float:
    """Design 6's "bounded" statistic of one run or chain: the joint norm of its matrices.

    With J_t = sqrt(sum over matrices of ||W||_F^2) and R = sqrt(sum of r^2): max(peak of J over
    the second half of the trace, `saturation_ceiling` of J) / R - 1 (the peak alone where the
    fit failed).
    """
    trace = record["trace"]
    steps = [number(r["step"]) for r in trace]
    curve = [total_norm(r["norms"]) for r in trace]
    radius = total_norm(record["stationary_radius"])
    peak = second_half_peak(curve, steps)
    ceiling = saturation_ceiling(curve, steps)
    highest = peak if math.isnan(ceiling) else largest([peak, ceiling])
    return highest / radius - 1


def null_criterion_check(
    experiment: Experiment, penalties: Sequence[str], tolerance: float
) -> Check:
    """The criterion passes where the theory holds: every chain's `joint_excess` <= tolerance."""
    if not has_nulls(experiment.runs, penalties):
        return not_measured(NULL_CRITERION_CHECK, at_most(tolerance), "no penalty-only chain")
    values = [joint_excess(run["null"][p]) for run in experiment.runs for p in penalties]
    note = (
        "a criterion that the penalty alone, run by the same chain, fails cannot tell a bounded "
        f"run from an unbounded one; mean {format_number(mean(values))}"
    )
    return Check(NULL_CRITERION_CHECK, largest(values), at_most(tolerance), note)


def joint_bounded_claim(
    experiment: Experiment, temperature: str, tolerance: float, checks: Sequence[Check]
) -> Claim:
    """Claim 1 of design 6: per seed, the largest over log and power of `joint_excess`, at
    most ``tolerance``; the chains' statistic and the per-matrix peaks go in the evidence."""
    penalties = experiment.penalties(temperature)
    statistics: list[list[float]] = []
    parts = []
    for p in penalties:
        records = experiment.records(temperature, p)
        runs = [joint_excess(r) for r in records]
        nulls = [joint_excess(run["null"][p]) for run in experiment.runs]
        peaks = [
            largest(list(bound_of(r).peak.values()))
            - largest(list(bound_of(run["null"][p]).peak.values()))
            for r, run in zip(records, experiment.runs, strict=True)
        ]
        statistics.append(runs)
        parts.append(
            f"{p}: run {format_number(mean(runs))}, penalty alone {format_number(mean(nulls))}, "
            f"largest single-matrix peak / r, run minus penalty alone {format_number(mean(peaks))}"
        )
    per_seed = [largest(list(seed)) for seed in zip(*statistics, strict=True)]
    return claim_from_seeds(
        f"{experiment.name}: with a light log or power regularizer, the norms of "
        f"{experiment.what} stay bounded (here: {experiment.where(temperature)}, the matrices' "
        "joint norm sqrt(sum ||W||^2), its peak over the second half of phase 2 and the upper "
        "end of its fitted asymptote's 95 % interval, at most "
        f"{round(100 * tolerance)} % above the joint stationary radius sqrt(sum r^2))",
        per_seed,
        at_most(tolerance),
        unit="max(joint peak, joint asymptote) / joint r - 1 (the larger of log and power)",
        checks=[*checks, null_criterion_check(experiment, penalties, tolerance)],
        evidence="Mean over seeds: " + "; ".join(parts) + ".",
        extra={"joint_excess": dict(zip(penalties, statistics, strict=True))},
    )


def has_nulls(runs: Sequence[Record], penalties: Sequence[str]) -> bool:
    """Whether every seed's run record holds the penalty-only chain of every penalty."""
    return bool(runs) and all(p in (run.get("null") or {}) for run in runs for p in penalties)
