"""The ``langevin`` study's null for "bounded": the penalty alone, run by the same Langevin chain.

In the theory's own setting (Langevin on lam x penalty alone, no loss, with a run's lam, s,
step size, length, start norms and record spacing) a matrix with n entries settles at the
stationary radius r with a spread of about r / sqrt(2 n), so a statistic read from one small
matrix's noisy curve can sit well above r where the theory holds exactly. "Bounded" is
therefore read on the joint norm of the targeted matrices (`joint_excess`), whose spread is
about sqrt(matrices) times smaller and which bounds each matrix; it is gated by the same
statistic of the penalty-only chain (`penalty_chain`, seed + `NULL_SEED_OFFSET`) being within
the tolerance on every seed and penalty (``python examples/langevin_bound_null.py`` prints
both per seed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from convergent.optim import Langevin
from convergent.regularize import Penalty, penalty
from convergent.studies.framework import Check, at_most, format_number, not_measured
from convergent.studies.framework import stored_number as number
from convergent.studies.langevin.measures import (
    Experiment,
    Record,
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
    """Langevin on lam x penalty alone (no loss), one flat matrix per name, each started in a
    random direction at its ``start_norms`` length; the trace of {"step", "norms"} at step 0
    and every ``every`` steps, as the study's runs record theirs."""
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


NULL_CRITERION_CHECK = (
    "joint statistic of the penalty-only chain (largest over seeds and penalties), the "
    "criterion in the theory's own setting"
)


def joint_excess(record: Record) -> float:
    """The "bounded" statistic of one run or chain: the joint norm of its matrices.

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
    runs = experiment.runs
    if not runs or not all(p in (run.get("null") or {}) for run in runs for p in penalties):
        return not_measured(NULL_CRITERION_CHECK, at_most(tolerance), "no penalty-only chain")
    values = [joint_excess(run["null"][p]) for run in experiment.runs for p in penalties]
    note = (
        "a criterion that the penalty alone, run by the same chain, fails cannot tell a bounded "
        f"run from an unbounded one; mean {format_number(mean(values))}"
    )
    return Check(NULL_CRITERION_CHECK, largest(values), at_most(tolerance), note)
