"""The ``langevin`` study: config, the run-length rule, lam selection, a smoke run, figures."""

from __future__ import annotations

import json
import math
import types
from dataclasses import replace
from pathlib import Path

import pytest

from convergent.regularize import (
    lam_for_stationary_radius,
    radial_relaxation_time,
    stationary_radius,
)
from convergent.studies import VERDICTS
from convergent.studies.framework import run_config, stored_number, write_study
from convergent.studies.langevin import STUDY, Config, claims_from_results, study
from convergent.studies.langevin import runs as langevin_runs
from convergent.studies.langevin import selection as langevin_selection
from convergent.studies.langevin.checks import DIVERGED_CHECK
from convergent.studies.langevin.pilot import PILOT_REGIMES, regime_named
from convergent.studies.langevin.plots import plot_curves, plot_norms
from convergent.train import TrainingDiverged
from tests.conftest import assert_drawn_figure

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "langevin-full"


def test_config_modes_and_bad_values():
    smoke, quick, full = (Config.for_mode(mode) for mode in ("smoke", "quick", "full"))
    # the full mode's seeds are unseen by the earlier designs' runs (0-14)
    assert full.seeds == (20, 21, 22, 23, 24) and len(quick.seeds) == 1
    assert full.selection_seed == 100
    assert smoke.langevin_steps < quick.langevin_steps <= full.langevin_steps
    assert full.temperatures == ("hot", "warm", "calibrated", "cold", "zero")
    assert full.claim_temperatures == ("hot", "warm", "calibrated")
    assert max(full.radius_factors) > 4
    assert full.selection_seed not in full.seeds
    with pytest.raises(ValueError, match=r"selection_seed=0 is one of seeds=\(0,\)"):
        Config(selection_seed=0)
    with pytest.raises(ValueError, match="temperature 'tepid' is not one of"):
        Config(temperatures=("hot", "tepid"))
    with pytest.raises(ValueError, match="claim_temperatures includes 'zero'"):
        Config(claim_temperatures=("zero",))
    with pytest.raises(ValueError, match=r"temperature 'warm' is not in temperatures"):
        Config(temperatures=("hot",))
    with pytest.raises(ValueError, match="claim_temperatures is empty"):
        Config(claim_temperatures=())
    with pytest.raises(ValueError, match=r"radius_factors=\(1.0,\) is out of range"):
        Config(radius_factors=(1.0,))
    with pytest.raises(ValueError, match=r"selection_tolerance=1.0 is out of range"):
        Config(selection_tolerance=1.0)
    with pytest.raises(ValueError, match=r"selection_tolerance=-0.1 is out of range"):
        Config(selection_tolerance=-0.1)
    with pytest.raises(ValueError, match=r"langevin_steps=20 is out of range"):
        Config(langevin_steps=20, max_langevin_steps=10)
    with pytest.raises(ValueError, match="not a pilot candidate"):
        regime_named("1 field")
    assert regime_named(PILOT_REGIMES[0]["name"]) == PILOT_REGIMES[0]


def _grid(rmses: list[float]) -> list[dict[str, float]]:
    factors = (1.5, 2.0, 4.0, 8.0, 16.0)
    return [{"radius_factor": f, "validation_rmse": r} for f, r in zip(factors, rmses, strict=True)]


def test_selection_takes_the_strongest_penalty_within_the_tolerance_of_the_best():
    # A flat grid from factor 2 on (the full run's LoRA/log selection grid, seed 100).
    lora = _grid([0.106987, 0.106515, 0.106079, 0.106009, 0.105997])
    # best 0.105997; x 1.005 = 0.1065270, so 0.106515 (factor 2) is within, 0.106987 is not.
    assert langevin_selection.selected_factor(lora, 0.005) == 2.0
    assert langevin_selection.selected_factor(lora, 0.0) == 16.0  # no tolerance: the best point
    assert langevin_selection.selected_factor(lora, 0.01) == 1.5  # 0.106987 <= 0.1070570
    # Attention/log: a clear minimum at 8; 16 is within 0.5 % but is the lighter penalty.
    attention = _grid([0.222155, 0.164478, 0.127209, 0.124454, 0.12494])
    assert langevin_selection.selected_factor(attention, 0.005) == 8.0
    # A diverged run is never selected, nor does it move the best.
    diverged = _grid([float("nan"), float("inf"), 0.2, 0.1, 0.1004])
    assert langevin_selection.selected_factor(diverged, 0.005) == 8.0
    with pytest.raises(ValueError, match="every radius factor's validation RMSE is NaN"):
        langevin_selection.selected_factor(_grid([float("nan")] * 5), 0.005)


def test_lam_is_selected_at_the_coldest_temperature_where_the_noise_moved_the_outcome():
    s = {"hot": 0.02, "warm": 1e-4, "calibrated": 1e-6}
    # tried coldest first, stopping at the first that moved 1 %: warm
    assert langevin_selection.coldest_moved({"calibrated": 0.001, "warm": 0.05}, s, 0.01) == "warm"
    # all moved: the coldest
    moved = {"hot": 3.0, "warm": 0.05, "calibrated": 0.02}
    assert langevin_selection.coldest_moved(moved, s, 0.01) == "calibrated"
    # none moved: the hottest tried
    unmoved = {"hot": 0.005, "warm": 0.001, "calibrated": 0.0}
    assert langevin_selection.coldest_moved(unmoved, s, 0.01) == "hot"


def test_a_selection_run_the_noise_made_diverge_counts_as_moved(monkeypatch):
    # validation RMSE 1.0 at s = 0, 1.001 at calibrated (0.1 %), NaN (diverged) at warm
    finals = {0.0: 1.0, 1e-6: 1.001, 1e-4: float("nan"), 0.02: 2.0}

    def run(experiment, base, data, *, s, **kwargs):
        return None, None, [{"validation_rmse": finals[s]}]

    monkeypatch.setattr(langevin_selection, "langevin_run", run)
    monkeypatch.setattr(langevin_selection, "evaluate", lambda *args: {"rmse": 1.0})
    data = types.SimpleNamespace(validation=None)
    settings = {
        "selection_seed": 100,
        "outcome_moved": 0.01,
        "claim_temperatures": ("hot", "warm", "calibrated"),
        "langevin_steps": 10,
        "langevin_lr": 0.01,
    }
    s = {"hot": 0.02, "warm": 1e-4, "calibrated": 1e-6}
    where = langevin_selection.selection_temperature("lora", None, data, settings, s)
    assert where["temperature"] == "warm" and where["moved"]["warm"] == math.inf
    finals[0.0] = float("nan")  # plain SGD itself diverged: no temperature can be chosen
    with pytest.raises(ValueError, match="lora run at s = 0 diverged"):
        langevin_selection.selection_temperature("lora", None, data, settings, s)


def test_theory_gives_the_stationary_radius_and_relaxation_in_steps():
    lam = lam_for_stationary_radius("power", 2.0, 256, 0.01)
    radii, steps = langevin_runs.theory("power", lam, {"a": 256, "b": 64}, 0.01, 0.02, 1.0)
    assert radii["a"] == pytest.approx(2.0)
    assert radii["b"] == pytest.approx(stationary_radius("power", lam, 64, 0.01))
    slowest = max(radial_relaxation_time("power", lam, n, 0.01) for n in (256, 64))
    assert steps == pytest.approx(slowest / 0.02)
    # No penalty or no noise: no stationary radius, no relaxation.
    radii, steps = langevin_runs.theory("log", 0.0, {"a": 256}, 0.01, 0.02, 1.0)
    assert radii == {"a": math.inf} and math.isnan(steps)
    assert math.isnan(langevin_runs.theory("log", lam, {"a": 256}, 0.0, 0.02, 1.0)[1])


def test_bound_steps_cover_the_relaxation_multiple_within_the_clamp():
    settings = {
        "langevin_lr": 0.01,
        "power_eps": 1.0,
        "record_every": 50,
        "relaxation_multiple": 5.0,
        "langevin_steps": 100,
        "max_langevin_steps": 100_000,
    }
    numel = {"q": 256, "k": 256}
    lam = lam_for_stationary_radius("log", 3.0, 256, 0.01)
    tau = radial_relaxation_time("log", lam, 256, 0.01) / 0.01
    steps = langevin_runs.bound_steps({"log": lam}, numel, 0.01, settings)
    assert steps % 50 == 0 and 5 * tau <= steps < 5 * tau + 50
    assert (
        langevin_runs.bound_steps(
            {"log": lam}, numel, 0.01, {**settings, "max_langevin_steps": 200}
        )
        == 200
    )
    assert langevin_runs.bound_steps({}, numel, 0.01, settings) == 100


def test_smoke_run_writes_report_json_and_figures(tmp_path):
    config = Config.for_mode("smoke")
    result = run_config(STUDY, config, tmp_path, progress=False)
    report = write_study(result, tmp_path)
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["data"]["design"] == 7
    # The payload re-scores to the very claims the run made.
    assert [c.to_json() for c in claims_from_results(payload)] == payload["claims"]
    assert result.claims and all(c.verdict in VERDICTS and c.checks for c in result.claims)
    for figure in result.figures:
        assert_drawn_figure(tmp_path / figure)
    assert "Temperatures" in report.read_text()
    data = payload["data"]
    s = data["temperatures"]
    examples = data["calibration"]["examples"]
    assert s["hot"] == pytest.approx(2 / examples)
    # calibrated_s with sigma^2 = the phase-1 training MSE, K = 256 values per field.
    assert s["calibrated"] == pytest.approx(4 * data["noise_variance"] / (examples * 256))
    assert s["cold"] == pytest.approx(s["calibrated"] / config.cold_factor) and s["zero"] == 0
    assert s["warm"] == pytest.approx(math.sqrt(s["hot"] * s["calibrated"]))
    # The gap and accuracy claims at every claim temperature, and every claim gated against
    # s = 0.
    for temperature in config.claim_temperatures:
        at = [c for c in result.claims if f"at the {temperature} temperature" in c.statement]
        assert len([c for c in at if "generalization gap" in c.statement]) == 2 * 2
    assert all(any("at s = 0" in check.name for check in c.checks) for c in result.claims)
    for experiment in ("attention", "lora"):
        (seed_run,) = data["runs"][experiment]
        # lam is selected at the coldest claim temperature whose noise moved the validation
        # RMSE by 1 % against s = 0 (the hottest tried if none did); tried coldest first.
        where = data["selection_temperature"][experiment]
        tried = list(where["moved"])
        assert tried == sorted(tried, key=lambda t: s[t])
        assert where["temperature"] == langevin_selection.coldest_moved(where["moved"], s, 0.01)
        selected = data["selection"][experiment]
        for record in selected.values():
            assert record["temperature"] == where["temperature"]
            best = min(record["grid"], key=lambda row: row["validation_rmse"])
            assert record["selected"] == best["radius_factor"]
        hot = seed_run["phase2"]["hot"]
        # lam is set once, in loss units, and kept at every temperature.
        for temperature, runs in seed_run["phase2"].items():
            assert runs["none"]["lam"] == 0.0
            for penalty in ("log", "power"):
                assert runs[penalty]["lam"] == pytest.approx(hot[penalty]["lam"])
                assert runs[penalty]["lam"] > 0
            steps = config.langevin_steps
            if temperature == "hot":
                assert runs["none"]["steps"] == runs["log"]["steps"] >= steps
            else:
                assert runs["log"]["steps"] == steps
            for variant in runs.values():
                trace = variant["trace"]
                assert trace[-1]["step"] == variant["steps"] and trace[0]["grad_rms"] is None
                assert set(trace[-1]["norms"]) == set(variant["numel"])


def _ten_steps() -> Config:
    """Smoke mode cut to two temperatures, two variants and 10 Langevin steps."""
    return replace(
        Config.for_mode("smoke"),
        temperatures=("hot", "calibrated"),
        claim_temperatures=("calibrated",),
        variants=("none", "log"),
        langevin_steps=10,
        record_every=5,
    )


def test_a_diverging_run_ends_as_diverged_and_the_study_goes_on(tmp_path, monkeypatch):
    config = _ten_steps()
    real_fit = langevin_runs.fit

    class Diverge:
        """Raises as `fit` does when the loss turns non-finite, at step 25: after the s = 0
        runs' last step (10), where the norm checks read the 40-step hot runs."""

        def on_step_end(self, step, metrics):
            if step == 24:
                raise TrainingDiverged("training diverged: the loss became nan at step 25")

    def fit_that_diverges_when_hot(model, optimizer, *args, callbacks, **kwargs):
        # the hot s is 2 / N (N = 100 in smoke mode), the calibrated one about 1e-6
        if optimizer.param_groups[0]["s"] >= 1e-3:
            callbacks = [*callbacks, Diverge()]
        return real_fit(model, optimizer, *args, callbacks=callbacks, **kwargs)

    monkeypatch.setattr(langevin_runs, "fit", fit_that_diverges_when_hot)
    result = run_config(STUDY, config, tmp_path, progress=False)  # no exception: the study goes on
    report = write_study(result, tmp_path).read_text()
    payload = json.loads((tmp_path / "results.json").read_text())
    seed = config.seeds[0]
    assert (
        f"Diverged (the loss or a gradient turned non-finite; the run ends there, its measures "
        f"read not measured, and the claims that read it are untested): attention seed {seed}, "
        f"hot none at step 25; attention seed {seed}, hot log at step 25; lora seed {seed}, hot "
        f"none at step 25; lora seed {seed}, hot log at step 25."
    ) in report
    for experiment in ("attention", "lora"):
        (seed_run,) = payload["data"]["runs"][experiment]
        for variant in seed_run["phase2"]["hot"].values():
            last = variant["trace"][-1]
            # evaluations every 5 steps, then the step that diverged, every measure NaN
            assert [r["step"] for r in variant["trace"]] == [0, 5, 10, 15, 20, 25]
            assert last["diverged"] is True
            assert math.isnan(stored_number(last["test_rmse"]))
        for variant in seed_run["phase2"]["calibrated"].values():  # the other runs ran through
            assert variant["trace"][-1]["step"] == 10 and "diverged" not in variant["trace"][-1]
    # The norm checks read the hot runs at step 10, before they diverged, and pass or fail on
    # finite numbers: the claims are untested because a run they read diverged.
    hot_claims = [c for c in result.claims if "hot temperature" in c.statement]
    assert len(hot_claims) == 4 and all(c.verdict == "untested" for c in hot_claims)
    for claim in hot_claims:
        (diverged,) = [c for c in claim.checks if c.name == DIVERGED_CHECK]
        assert diverged.passed is False and "at step 25" in diverged.note
    calibrated = [c for c in result.claims if "calibrated temperature" in c.statement]
    assert calibrated and not any(
        check.name == DIVERGED_CHECK for c in calibrated for check in c.checks
    )
    rescored = [c.to_json() for c in claims_from_results(payload)]
    assert json.dumps(rescored) == json.dumps(payload["claims"])  # NaN != NaN in a plain ==


@pytest.fixture(scope="module")
def ten_steps_run(tmp_path_factory):
    """`_ten_steps` run in one process, shared by the resume and the parallel test."""
    folder = tmp_path_factory.mktemp("langevin-ten-steps")
    return folder, run_config(STUDY, _ten_steps(), folder, progress=False)


def test_a_second_run_reuses_every_unit(ten_steps_run, monkeypatch):
    folder, first = ten_steps_run
    # temperatures, a selection per experiment, a final run per experiment (one seed)
    assert len(list((folder / "units").glob("*.pt"))) == 1 + 2 + 2

    def refuse(*args, **kwargs):
        raise AssertionError("a cached unit was computed again")

    for name in ("final_runs", "select_lam", "temperatures"):
        monkeypatch.setattr(study, name, refuse)
    second = run_config(STUDY, _ten_steps(), folder, progress=False)
    assert [c.to_json() for c in second.claims] == [c.to_json() for c in first.claims]
    assert any("5 unit(s) reused" in note and "0 computed" in note for note in second.notes)


def test_parallel_jobs_give_the_same_numbers_as_one_process(ten_steps_run, tmp_path):
    _, alone = ten_steps_run
    parallel = run_config(STUDY, replace(_ten_steps(), workers=2), tmp_path, progress=False)
    assert json.dumps(parallel.data["runs"], sort_keys=True, default=str) == json.dumps(
        alone.data["runs"], sort_keys=True, default=str
    )
    assert [c.to_json() for c in parallel.claims] == [c.to_json() for c in alone.claims]


@pytest.mark.parametrize("source", ["results.json", "history/design6.results.json"])
def test_figures_draw_the_committed_full_runs_whose_seeds_may_differ_in_length(tmp_path, source):
    payload = json.loads((RESULTS / source).read_text())
    # The bound temperature's run length depends on each seed's start weights (up to the step
    # cap): design 6's LoRA seeds differ in length, and the figures must still draw.
    hot = [run["phase2"]["hot"]["log"]["steps"] for run in payload["data"]["runs"]["lora"]]
    assert len(set(hot)) > 1 or source == "results.json"
    config = Config.for_mode("full")
    for name in (
        *plot_norms(payload["data"], config, tmp_path),
        *plot_curves(payload["data"], tmp_path),
    ):
        assert_drawn_figure(tmp_path / name)
