"""The residual claims, on synthetic payloads whose answers are worked out here; the retired
designs' results kept as data."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from convergent.studies.framework import VERDICTS
from convergent.studies.residual import DESIGN, claims_from_results
from convergent.studies.residual.measures import BROKEN_EXCESS, common_band, measure

HISTORY = Path(__file__).resolve().parents[2] / "docs/results/residual-full/history"

STEPS = 200
BETAS = (0.0, 0.5, 1.0)
# Per-step factors and (sigma_min/sigma_max)^2 by beta: geometric curves, so the band
# log-slope of each is exactly log(q) and the certified rate q.
FACTORS = {0.0: 0.99, 0.5: 0.98, 1.0: 0.97}
RATIOS = {0.0: 1e-9, 0.5: 0.002, 1.0: 0.004}


def _run(beta, seed, losses, lr=0.1, ratio=None, diverged=False):
    count = 3
    return {
        "beta": beta,
        "seed": seed,
        "lr": lr,
        "steps": len(losses) - 1,
        "losses": list(losses),
        "residual_sigma_min": [0.1 + beta] * count,
        "squared_ratio": [1e-9] * count,
        "residual_squared_ratio": [RATIOS[beta] if ratio is None else ratio] * count,
        "diverged": diverged,
    }


def _geometric(beta, start=1.0):
    return [start * FACTORS[beta] ** t for t in range(STEPS + 1)]


def _payload(runs, seeds=(0, 1, 2), regimes=((0.1, STEPS),)):
    config = {
        "seeds": list(seeds),
        "regimes": [list(r) for r in regimes],
        "transient_fraction": 0.1,
        "envelope_tolerance": 0.01,
    }
    return {"config": config, "data": {"one_layer_runs": runs}}


def _sweep(seeds=(0, 1, 2)):
    # Starting losses differ by seed and beta, as in the study (L_0 rises with beta).
    return [
        _run(beta, seed, _geometric(beta, start=1.0 + beta + 0.1 * seed))
        for seed in seeds
        for beta in BETAS
    ]


def test_measure_a_geometric_curve_and_a_plateau():
    geometric = measure(_run(0.5, 0, _geometric(0.5)), transient_fraction=0.1)
    assert geometric.excess == pytest.approx(0.0, abs=1e-9)
    assert geometric.certified == pytest.approx(0.98)
    assert geometric.at_transient == pytest.approx(0.98**20)
    # A plateau, then a drop: [1, 1, 0.01] from t0 = 0; the chord at t = 1 is log(0.1), so
    # the loss 1 lies log(10) above it.
    plateau = measure(_run(0.5, 0, [1.0, 1.0, 0.01]), transient_fraction=0.0)
    assert plateau.excess == pytest.approx(math.log(10.0))
    assert plateau.certified == pytest.approx(1.0)
    broken = measure(_run(0.5, 0, [1.0, math.nan, math.nan], diverged=True), 0.5)
    assert broken.excess == BROKEN_EXCESS and math.isnan(broken.certified)


def test_common_band_runs_from_the_lowest_loss_at_t0_to_above_the_highest_final():
    measured = [measure(run, 0.1) for run in _sweep(seeds=(0,))]
    high, low = common_band(measured)
    assert high == pytest.approx(min(FACTORS[b] ** 20 * (1.0 + b) for b in BETAS))
    assert low == pytest.approx(1.05 * max(FACTORS[b] ** STEPS * (1.0 + b) for b in BETAS))


def test_claims_on_geometric_curves():
    claims = claims_from_results(_payload(_sweep()))
    assert len(claims) == 4  # bound, speed, rate bound for one regime; the sigma_min floor
    bound, speed, rate, floor = claims
    # Geometric curves sit on their envelope: no excess.
    assert bound.per_seed == pytest.approx([0.0] * 3, abs=1e-9)
    assert bound.verdict == "reproduced"
    # Speed: -log q; beta 1 over beta 0.
    expected = math.log(math.log(0.97) / math.log(0.99))
    assert speed.per_seed == pytest.approx([expected] * 3)
    assert speed.verdict == "reproduced"
    assert all(check.passed for check in speed.checks)
    # The bound's constant from beta 1; tested at beta 0.5.
    margin = math.log(math.log(0.98) / math.log(0.97)) - math.log(0.002 / 0.004)
    assert rate.per_seed == pytest.approx([margin] * 3)
    assert margin > 0 and rate.verdict == "reproduced"
    # The slope of log speed on log ratio over beta > 0, two points.
    slope = (math.log(-math.log(0.97)) - math.log(-math.log(0.98))) / math.log(2.0)
    assert f"[{slope:.3g}, {slope:.3g}, {slope:.3g}]" in rate.evidence
    assert floor.per_seed == pytest.approx([math.log10(0.6 / 0.1)] * 3)


def test_a_plateau_at_one_seed_moves_the_bound_effect_and_its_interval():
    runs = _sweep()
    plateau = [1.5] * 101 + [1.5 * 0.9**t for t in range(1, 101)]
    runs[4] = _run(0.5, 1, plateau)  # seed 1, beta 0.5
    bound = claims_from_results(_payload(runs))[0]
    # From t0 = 20 the envelope runs from 1.5 to 1.5 * 0.9^100 over 180 steps; the worst point
    # is the plateau's end, t = 100, 80 steps in.
    excess = -80 / 180 * 100 * math.log(0.9)
    assert bound.per_seed == pytest.approx([0.0, excess, 0.0], abs=1e-9)
    values = np.array(bound.per_seed)
    half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
    assert bound.interval == pytest.approx((values.mean() - half, values.mean() + half))
    assert bound.verdict == "inconclusive"
    # At beta = 0 the bound is reported, not part of the effect (the claim is for beta > 0).
    longer = [1.5] * 151 + [1.5 * 0.7**t for t in range(1, 51)]
    runs[3] = _run(0.0, 1, longer)
    with_zero = claims_from_results(_payload(runs))[0]
    assert with_zero.per_seed == pytest.approx(bound.per_seed)
    assert "broken (excess > 0.01) in 1 of 3 runs" in with_zero.evidence


def test_regimes_are_scored_apart():
    small = [{**run, "lr": 0.01} for run in _sweep()]
    payload = _payload(_sweep() + small, regimes=((0.1, STEPS), (0.01, STEPS)))
    claims = claims_from_results(payload)
    assert len(claims) == 7
    assert "lr 0.1," in claims[0].statement and "lr 0.01," in claims[3].statement
    # A regime with no runs is skipped; the lr must match, not only the steps.
    assert len(claims_from_results(_payload(small))) == 0


def test_the_tuned_regime_keeps_each_betas_own_step_size():
    # Each beta at its own step size; the fixed regime (lr 0.1) must not pick these runs up.
    step_sizes = {0.0: 0.3, 0.5: 1.0, 1.0: 0.1}
    tuned = [{**run, "lr": step_sizes[run["beta"]]} for run in _sweep()]
    payload = _payload(_sweep())
    payload["config"]["tuned_steps"] = STEPS
    payload["data"]["tuned_runs"] = tuned
    claims = claims_from_results(payload)
    assert len(claims) == 7  # 3 fixed, 3 tuned, the floor from the first regime
    assert "lr tuned per beta (0: 0.3, 0.5: 1, 1: 0.1)" in claims[3].statement
    assert "the theorem's form" in claims[5].evidence
    assert "side test" in claims[2].evidence
    # The tuned curves are the fixed ones here, so every effect is the same.
    for fixed, chosen in zip(claims[:3], claims[3:6], strict=True):
        assert chosen.per_seed == pytest.approx(fixed.per_seed)
    # Without tuned runs the tuned regime is absent.
    payload["data"]["tuned_runs"] = []
    assert len(claims_from_results(payload)) == 4


def test_an_empty_band_or_an_untrained_curve_makes_the_claims_untested():
    runs = _sweep()
    # A curve that barely moves: its final loss lies above the others' loss at t0.
    runs[0] = _run(0.0, 0, [2.0 - 1e-4 * t for t in range(STEPS + 1)])
    bound, speed, rate, _ = claims_from_results(_payload(runs))
    band = next(c for c in speed.checks if c.name.startswith("the common loss band"))
    assert band.passed is False and band.value < 2.0
    assert speed.verdict == "untested" and rate.verdict == "untested"
    # The trained check reads only beta > 0 runs: the bound claim is still tested.
    assert bound.verdict == "reproduced"
    slow = _sweep()
    slow[1] = _run(0.5, 0, [1.0 - 0.5 * t / STEPS for t in range(STEPS + 1)])
    assert claims_from_results(_payload(slow))[0].verdict == "untested"


def _history() -> list[Path]:
    return sorted(HISTORY.glob("design*.results.json*"))


def _read(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def test_each_history_file_holds_the_claims_it_was_scored_with():
    assert [path.name for path in _history()] == ["design1.results.json"]
    for path in _history():
        payload = _read(path)
        assert payload["name"] == "residual"
        assert payload["claims"], path
        assert all(claim["verdict"] in VERDICTS for claim in payload["claims"])


def test_a_payload_of_an_earlier_design_is_refused_with_one_sentence():
    payload = _read(HISTORY / "design1.results.json")
    message = (
        rf"these residual results are of design 1, and this code scores design {DESIGN} only; "
        r"earlier designs' full results, with the claims they were scored with, are in "
        r"docs/results/residual-full/history/$"
    )
    with pytest.raises(ValueError, match=message):
        claims_from_results(payload)
    # A stored design key is read before the config's shape.
    current = _payload(_sweep())
    current["data"]["design"] = 1
    with pytest.raises(ValueError, match="of design 1,"):
        claims_from_results(current)
    current["data"]["design"] = DESIGN
    assert len(claims_from_results(current)) == 4
