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
from convergent.studies.residual.claims import CHANCE_FRACTION, RATE_SLOPE, RISE_TOLERANCE
from convergent.studies.residual.measures import (
    BROKEN_EXCESS,
    common_band,
    largest_rise,
    measure,
    smallest_step_speedup,
)

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


def _payload(runs, seeds=(0, 1, 2), regimes=((0.1, STEPS),), design=DESIGN):
    config = {
        "seeds": list(seeds),
        "regimes": [list(r) for r in regimes],
        "transient_fraction": 0.1,
        "envelope_tolerance": 0.01,
    }
    data = {"one_layer_runs": runs} | ({"design": design} if design is not None else {})
    return {"config": config, "data": data}


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
    assert len(claims) == 4  # bound, speed, rate for one regime; the sigma_min floor
    bound, speed, rate, floor = claims
    assert not any(claim.exploratory for claim in claims)
    # Geometric curves sit on their envelope: no excess; they never rise.
    assert bound.per_seed == pytest.approx([0.0] * 3, abs=1e-9)
    assert bound.verdict == "reproduced"
    step = next(c for c in bound.checks if c.name.startswith("step size within"))
    assert step.value == 0.0 and step.passed
    # Speed -log q; the slowest consecutive step is 0.5 -> 1 (log(0.0305 / 0.0202) = 0.41,
    # against log(0.0202 / 0.01005) = 0.70 for 0 -> 0.5).
    speeds = {beta: -math.log(factor) for beta, factor in FACTORS.items()}
    expected = min(math.log(speeds[0.5] / speeds[0.0]), math.log(speeds[1.0] / speeds[0.5]))
    assert expected == pytest.approx(math.log(speeds[1.0] / speeds[0.5]))
    assert speed.per_seed == pytest.approx([expected] * 3)
    assert speed.verdict == "reproduced"
    assert all(check.passed for check in speed.checks)
    # beta 1 over beta 0, design 2's effect, is kept in the evidence.
    assert f"{math.log(speeds[1.0] / speeds[0.0]):+.3f}" in speed.evidence
    # Rate: the slope of log speed on log ratio over beta > 0, two points; the ratio doubles.
    slope = (math.log(speeds[1.0]) - math.log(speeds[0.5])) / math.log(0.004 / 0.002)
    assert rate.per_seed == pytest.approx([slope] * 3)
    assert slope > RATE_SLOPE and rate.verdict == "reproduced"
    assert [c.name.partition(":")[0] for c in rate.checks] == [
        "GD trained",
        "the common loss band spans at least a factor 2 (smallest high/low over seeds)",
        "softmax collapses rank at beta = 0",
        "step size within the theorem's condition",
    ]
    # Design 2's bound margin is reported beside it.
    margin = math.log(speeds[0.5] / speeds[1.0]) - math.log(0.002 / 0.004)
    assert f"{margin:.3f}" in rate.evidence
    assert floor.per_seed == pytest.approx([math.log10(0.6 / 0.1)] * 3)
    # Every changed claim says what changed; the floor's test did not.
    assert all(claim.revised for claim in (bound, speed, rate)) and not floor.revised


def test_largest_rise_against_hand_worked_curves():
    # From t0 = 0: the climbs are 0.5 -> 0.6 and 0.4 -> 0.45; the larger is log(1.2).
    curve = [1.0, 0.5, 0.6, 0.4, 0.45]
    assert largest_rise(curve, 0) == pytest.approx(math.log(0.6 / 0.5))
    # From t0 = 3 the window is [0.4, 0.45].
    assert largest_rise(curve, 3) == pytest.approx(math.log(0.45 / 0.4))
    # A monotone curve never rises; a non-finite loss from t0 on breaks the run.
    assert largest_rise([1.0, 0.5, 0.5, 0.25], 0) == 0.0
    assert largest_rise([1.0, 0.5, math.inf], 1) == BROKEN_EXCESS
    # A spike before t0 does not count.
    assert largest_rise([1.0, 2.0, 0.5, 0.4], 2) == 0.0


def _with_bump(beta, rise, start=1.0):
    """A geometric curve whose step 100 climbs ``rise`` (in log) above step 99, then goes on."""
    losses = _geometric(beta, start)
    losses[100] = losses[99] * math.exp(rise)
    return losses


@pytest.mark.parametrize(
    ("rise", "passes"), [(0.5 * RISE_TOLERANCE, True), (2 * RISE_TOLERANCE, False)]
)
def test_the_step_size_check_passes_a_small_rise_and_fails_a_larger_one(rise, passes):
    runs = _sweep()
    runs[4] = _run(0.5, 1, _with_bump(0.5, rise, start=1.6))  # seed 1, beta 0.5
    bound, speed, rate, _ = claims_from_results(_payload(runs))
    step = next(c for c in bound.checks if c.name.startswith("step size within"))
    assert step.value == pytest.approx(rise)
    assert step.passed is passes
    assert (bound.verdict == "untested") is not passes
    assert (rate.verdict == "untested") is not passes
    # The speed claim is not gated by the theorem's step condition.
    assert speed.verdict != "untested"


def test_a_rise_at_beta_0_leaves_the_check_alone_and_a_diverged_run_fails_it():
    runs = _sweep()
    runs[0] = _run(0.0, 0, _with_bump(0.0, 1.0))  # beta 0: not the claim's runs
    bound = claims_from_results(_payload(runs))[0]
    assert bound.checks[1].value == pytest.approx(0.0)
    runs[1] = _run(0.5, 0, [1.0] + [math.nan] * STEPS, diverged=True)
    bound = claims_from_results(_payload(runs))[0]
    assert bound.checks[1].value == BROKEN_EXCESS and bound.checks[1].passed is False
    assert bound.verdict == "untested"


def test_the_speed_claim_fails_where_one_step_up_in_beta_is_slower():
    # beta 0.5 is the fastest: 0 -> 0.5 speeds up, 0.5 -> 1 slows down, 0 -> 1 still speeds up.
    factors = {0.0: 0.99, 0.5: 0.97, 1.0: 0.98}
    runs = [
        _run(beta, seed, [(1.0 + beta + 0.1 * seed) * factors[beta] ** t for t in range(STEPS + 1)])
        for seed in (0, 1, 2)
        for beta in BETAS
    ]
    speed = claims_from_results(_payload(runs))[1]
    slower = math.log(math.log(0.98) / math.log(0.97))
    assert speed.per_seed == pytest.approx([slower] * 3)
    assert speed.verdict == "not reproduced"
    assert "0.5->1: " + f"{slower:+.3f}" in speed.evidence
    assert smallest_step_speedup({0.0: 1.0, 0.5: 2.0, 1.0: 1.5}) == pytest.approx(math.log(0.75))
    assert math.isnan(smallest_step_speedup({1.0: 2.0}))


def test_the_rate_claim_is_the_log_log_slope_with_its_interval():
    # Per seed the ratio at beta 1 is 2, 10 or 50 times that at beta 0.5, the speeds as in
    # FACTORS: the slope falls as the ratio spreads while the speed stays put.
    spreads = (2.0, 10.0, 50.0)
    runs = [
        _run(beta, seed, _geometric(beta), ratio={0.0: 1e-9, 0.5: 0.002, 1.0: 0.002 * k}[beta])
        for seed, k in enumerate(spreads)
        for beta in BETAS
    ]
    rate = claims_from_results(_payload(runs))[2]
    lift = math.log(math.log(0.97) / math.log(0.98))
    slopes = [lift / math.log(k) for k in spreads]
    assert rate.per_seed == pytest.approx(slopes)
    mean = float(np.mean(slopes))
    half = stats.t.ppf(0.975, 2) * np.std(slopes, ddof=1) / math.sqrt(3)
    assert rate.effect == pytest.approx(mean)
    assert rate.interval == pytest.approx((mean - half, mean + half))
    assert rate.interval is not None
    low, high = rate.interval
    assert low < RATE_SLOPE < high and rate.verdict == "inconclusive"
    # The ratio 100x apart at every seed: slope about 0.09, wholly below 0.5.
    flat = [
        _run(beta, seed, _geometric(beta), ratio={0.0: 1e-9, 0.5: 0.002, 1.0: 0.2}[beta])
        for seed in (0, 1, 2)
        for beta in BETAS
    ]
    assert claims_from_results(_payload(flat))[2].verdict == "not reproduced"


def _depth_run(depth, beta, seed, tail):
    # 20 steps: the head (first 2) at ln 2, the tail (last 2) at ``tail``.
    losses = [math.log(2.0)] * 18 + [tail] * 2
    return {"depth": depth, "beta": beta, "seed": seed, "losses": losses, "validation_error": 0.3}


def _depth_payload(tails):
    """``tails[(depth, beta)]``: the tail loss of every seed (0, 1, 2), plus 0.01 x seed."""
    runs = [
        _depth_run(depth, beta, seed, tail + 0.01 * seed)
        for (depth, beta), tail in tails.items()
        for seed in (0, 1, 2)
    ]
    payload = _payload(_sweep())
    payload["data"]["depth_runs"] = runs
    return payload


def test_the_depth_claim_needs_both_arms_above_chance():
    tails = {(2, 0.0): 0.55, (2, 1.0): 0.45, (6, 0.0): 0.60, (6, 1.0): 0.40}
    depth = claims_from_results(_depth_payload(tails))[-1]
    # Gap growth per seed: (0.60 - 0.40) - (0.55 - 0.45) = 0.1 at every seed.
    assert depth.per_seed == pytest.approx([0.1] * 3)
    chance = next(c for c in depth.checks if c.name.startswith("both arms train above chance"))
    assert chance.value == pytest.approx((0.60 + 0.01) / math.log(2.0))
    assert chance.passed and depth.verdict == "reproduced"
    # beta 0 at chance at depth 6: the gap grows, but the claim is untested.
    tails[(6, 0.0)] = math.log(2.0)
    depth = claims_from_results(_depth_payload(tails))[-1]
    chance = next(c for c in depth.checks if c.name.startswith("both arms train above chance"))
    assert chance.value == pytest.approx((math.log(2.0) + 0.01) / math.log(2.0))
    assert chance.value is not None and chance.value > CHANCE_FRACTION
    assert chance.passed is False
    assert "(6, 0)" in chance.note
    assert depth.effect is not None and depth.effect > 0 and depth.verdict == "untested"
    assert depth.revised


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
    # The selected step sizes are in the test, not in the name, which stays the same across
    # designs whatever the selection.
    assert (
        "(lr tuned per beta, 200 steps; here: step sizes selected per beta 0: 0.3, 0.5: 1, "
        "1: 0.1; after" in claims[3].statement
    )
    assert [c.key for c in claims[:4]] == [
        "residual.converges_linearly_lr_0p1",
        "residual.speeds_up_with_beta_lr_0p1",
        "residual.rate_follows_sigma_ratio_lr_0p1",
        "residual.converges_linearly_lr_tuned",
    ]
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
    assert band.passed is False and band.value is not None and band.value < 2.0
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
    assert [path.name for path in _history()] == ["design1.results.json", "design2.results.json"]
    for path in _history():
        payload = _read(path)
        assert payload["name"] == "residual"
        assert payload["claims"], path
        assert all(claim["verdict"] in VERDICTS for claim in payload["claims"])
        assert not any(claim.get("exploratory") for claim in payload["claims"])


def test_design_2_data_is_scored_exploratory_with_the_current_tests():
    payload = _read(HISTORY / "design2.results.json")
    claims = claims_from_results(payload)
    assert len(claims) == 11 and all(claim.exploratory for claim in claims)
    assert all("(exploratory" in claim.label for claim in claims)
    # A synthetic payload without a design key but with regimes is design 2's too.
    synthetic = claims_from_results(_payload(_sweep(), design=None))
    assert all(claim.exploratory for claim in synthetic)
    assert [c.per_seed for c in synthetic] == [
        c.per_seed for c in claims_from_results(_payload(_sweep()))
    ]


@pytest.mark.parametrize("design", [1, 4])
def test_a_payload_of_another_design_is_refused_with_one_sentence(design):
    message = (
        rf"these residual results are of design {design}, and this code scores design "
        rf"{DESIGN} and, exploratory, design 2's data only; earlier designs' full results, with "
        r"the claims they were scored with, are in docs/results/residual-full/history/$"
    )
    current = _payload(_sweep(), design=design)
    with pytest.raises(ValueError, match=message):
        claims_from_results(current)


def test_design_1_results_are_refused():
    payload = _read(HISTORY / "design1.results.json")
    with pytest.raises(ValueError, match="of design 1, and this code scores design 3"):
        claims_from_results(payload)
