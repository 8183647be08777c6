"""The langevin claim "bounded": the matrices' joint norm, gated by the penalty-only chain.

The chain is checked against the Euler-Maruyama rule written out here (the log penalty's
gradient by hand, the noise from torch generators seeded as `Langevin` documents); the claim on
the synthetic payload (`langevin_payload`), with answers worked out here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from convergent.studies.langevin import NULL_SEED_OFFSET, claims_from_results, joint_excess
from convergent.studies.langevin.null import NULL_CRITERION_CHECK, penalty_chain
from tests.studies.langevin_payload import MATRICES, by_name, payload


def test_the_chain_is_langevin_on_the_penalty_alone():
    lam, s, lr, steps, every = 0.3, 0.05, 0.01, 30, 10
    numel, start = {"a": 5, "b": 3}, {"a": 1.5, "b": 0.5}
    trace = penalty_chain("log", lam, start, numel, s=s, lr=lr, steps=steps, every=every,
                          eps=1.0, seed=4)  # fmt: skip
    # the start: a random direction (generator seeded 4, matrices in order) at each length
    generator = torch.Generator().manual_seed(4)
    weights = {}
    for name, count in numel.items():
        direction = torch.randn(count, generator=generator, dtype=torch.float64)
        weights[name] = direction * (start[name] / direction.norm())
    # the steps: W <- W - lr * grad(lam ||W||^2 log(1 + ||W||^2)) + sqrt(lr s) xi, xi from
    # Langevin's CPU generator (seeded 4), drawn per matrix in order
    noise = torch.Generator().manual_seed(4)
    expected = [{name: float(w.norm()) for name, w in weights.items()}]
    for step in range(1, steps + 1):
        for name, w in weights.items():
            q = float(w.square().sum())
            grad = lam * (2 * math.log1p(q) + 2 * q / (1 + q)) * w
            xi = torch.randn(w.shape, generator=noise, dtype=torch.float64)
            weights[name] = w - lr * grad + math.sqrt(lr * s) * xi
        if step % every == 0:
            expected.append({name: float(w.norm()) for name, w in weights.items()})
    assert [record["step"] for record in trace] == [0, 10, 20, 30]
    for record, norms in zip(trace, expected, strict=True):
        assert record["norms"] == pytest.approx(norms, rel=1e-12)


def test_the_null_seed_is_the_runs_plus_a_fixed_offset():
    # a chain's noise is its own but reproducible: the same seed gives the same chain
    options: dict[str, Any] = {"s": 0.02, "lr": 0.01, "steps": 20, "every": 10, "eps": 1.0}
    one = penalty_chain("power", 0.1, {"w": 1.0}, {"w": 4}, seed=NULL_SEED_OFFSET, **options)
    two = penalty_chain("power", 0.1, {"w": 1.0}, {"w": 4}, seed=NULL_SEED_OFFSET, **options)
    other = penalty_chain("power", 0.1, {"w": 1.0}, {"w": 4}, seed=NULL_SEED_OFFSET + 1, **options)
    assert one == two and one != other


def test_the_joint_statistic_of_a_falling_curve_is_its_second_half_peak():
    # a curve that ends below its start has no asymptote fit (the peak decides): the joint norm
    # sqrt(a^2 + b^2) over sqrt(ra^2 + rb^2), its largest value from step 20 on, minus 1
    a, b = [3.0, 2.0, 1.9, 2.2, 1.0], [4.0, 1.0, 1.5, 0.4, 0.5]
    record = {
        "trace": [
            {"step": 10 * i, "norms": {"a": x, "b": y}}
            for i, (x, y) in enumerate(zip(a, b, strict=True))
        ],
        "stationary_radius": {"a": 1.5, "b": 2.0},
    }
    expected = (
        max(math.hypot(x, y) for x, y in zip(a[2:], b[2:], strict=True)) / math.hypot(1.5, 2.0) - 1
    )
    assert joint_excess(record) == pytest.approx(expected, rel=1e-12)


def test_the_claim_scores_the_run_alone_and_checks_the_criterion_on_the_chain():
    base = claims_from_results(payload(null_scale=1.0))
    scale = 0.9
    scaled = claims_from_results(payload(null_scale=scale))
    for experiment in MATRICES:
        one, other = by_name(base, experiment)["bounded"], by_name(scaled, experiment)["bounded"]
        assert "joint norm" in one.statement
        # the effect is the run's own statistic: the chain does not enter it
        assert list(one.per_seed) == list(other.per_seed)
        runs = one.extra["joint_excess"]
        assert list(one.per_seed) == [
            max(pair) for pair in zip(runs["log"], runs["power"], strict=True)
        ]
        # the chain's statistic, every norm x c: peak and asymptote scale by c
        check = {c.name: c for c in other.checks}[NULL_CRITERION_CHECK]
        expected = max(scale * (1 + e) - 1 for values in runs.values() for e in values)
        assert check.value == pytest.approx(expected, rel=1e-4)


def test_a_chain_that_fails_the_criterion_leaves_the_claim_untested():
    for experiment in MATRICES:
        bounded = by_name(claims_from_results(payload(null_scale=3.0)), experiment)["bounded"]
        check = {c.name: c for c in bounded.checks}[NULL_CRITERION_CHECK]
        assert check.passed is False
        assert bounded.verdict == "untested"
