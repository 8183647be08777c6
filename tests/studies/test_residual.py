from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from convergent.studies import VERDICTS, rescore
from convergent.studies import residual as study
from convergent.studies.framework.common import json_ready, write_study
from convergent.studies.residual import Config, run
from convergent.studies.residual_claims import claims_from_results
from convergent.studies.residual_claims_v1 import (
    depth_gaps,
    floor_decades,
    head_and_tail_means,
    smallest_gap_growth,
    spearman,
    worst_r_squared,
)
from convergent.studies.residual_depth import (
    DepthRun,
    ScaledResidualOutput,
    depth_run_to_dict,
    set_residual_coefficient,
)
from convergent.studies.residual_onelayer import GradientDescentRun, run_to_dict
from tests.conftest import assert_drawn_figure

COMMITTED = Path(__file__).resolve().parents[2] / "docs/results/residual-full/results.json"
# The design-1 full results, as committed before design 2 replaced them: residual_claims_v1
# still scores such payloads.
DESIGN_1 = Path(__file__).resolve().parent / "data" / "residual_design1_results.json"


def _tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=8, hidden_dropout_prob=0.0,
    )  # fmt: skip
    return BertModel(config, add_pooling_layer=False).eval()


def test_scaled_residual_at_beta_one_is_bert_and_at_zero_drops_the_input():
    model = _tiny_bert()
    ids = torch.randint(0, 30, (2, 5))
    reference = model(input_ids=ids).last_hidden_state
    assert set_residual_coefficient(model, 1.0) == 4
    torch.testing.assert_close(model(input_ids=ids).last_hidden_state, reference)
    assert {n for n, _ in model.named_parameters()} == {
        n for n, _ in _tiny_bert().named_parameters()
    }
    set_residual_coefficient(model, 0.0)
    output = model.encoder.layer[0].attention.output
    assert isinstance(output, ScaledResidualOutput) and output.beta == 0.0
    h, x = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    torch.testing.assert_close(output(h, x), output.LayerNorm(output.dense(h)))
    assert not torch.allclose(model(input_ids=ids).last_hidden_state, reference)


def test_config_modes_and_bad_values():
    assert Config.for_mode("full").seeds == (0, 1, 2, 3, 4)
    assert Config.for_mode("full").regimes == ((0.1, 2000), (0.01, 6000))
    assert Config.for_mode("quick").seeds == (0,)
    assert Config.for_mode("quick").betas == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert Config.for_mode("quick").depths == (2, 6, 10)
    with pytest.raises(ValueError, match=r"beta=1.5 is out of range"):
        Config(betas=(0.0, 1.5))
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")
    with pytest.raises(ValueError, match=r"regime \(lr=0.0, steps=100\) is out of range"):
        Config(regimes=((0.0, 100),))
    with pytest.raises(ValueError, match=r"transient_fraction=0\.5 is out of range"):
        Config(transient_fraction=0.5)


# --- measurement functions, against answers worked out by hand -------------------------------


def test_head_and_tail_means_use_a_tenth_of_the_steps():
    # 20 steps: the first and last 2 -> (0 + 1) / 2 and (18 + 19) / 2.
    assert head_and_tail_means([float(v) for v in range(20)]) == (0.5, 18.5)
    # 5 steps: a tenth rounds down to 0, so one step each.
    assert head_and_tail_means([4.0, 9.0, 9.0, 9.0, 2.0]) == (4.0, 2.0)
    # 200 steps as in full mode: 20 each; JSON's "nan" strings are read as numbers.
    losses = [1.0] * 20 + ["nan"] * 160 + [0.25] * 20
    assert head_and_tail_means(losses) == (1.0, 0.25)


def test_worst_r_squared_counts_a_failed_fit_as_zero():
    good = {"r_squared": 0.95, "rate_high": 0.99, "diverged": False}
    worse = {"r_squared": 0.91, "rate_high": 0.999, "diverged": False}
    assert worst_r_squared([good, worse]) == pytest.approx(0.91)
    assert worst_r_squared([good, {**worse, "diverged": True}]) == 0.0
    assert worst_r_squared([good, {**worse, "rate_high": 1.0}]) == 0.0
    assert worst_r_squared([good, {**worse, "r_squared": "nan"}]) == 0.0
    assert math.isnan(worst_r_squared([]))


def test_floor_decades_and_gap_growth():
    rows = [
        {"beta": 0.0, "residual_sigma_min_min": 1e-4},
        {"beta": 0.5, "residual_sigma_min_min": 0.3},
        {"beta": 1.0, "residual_sigma_min_min": 0.1},
    ]
    assert floor_decades(rows) == pytest.approx(3.0)  # min(0.3, 0.1) / 1e-4 = 10^3
    assert math.isnan(floor_decades(rows[1:]))  # no beta = 0 run
    assert smallest_gap_growth({2: 0.1, 6: 0.3, 10: 0.25}) == pytest.approx(-0.05)
    assert smallest_gap_growth({10: 0.5, 2: 0.1, 6: 0.3}) == pytest.approx(0.2)
    assert math.isnan(smallest_gap_growth({2: 0.1}))
    runs = [
        {"depth": 2, "beta": 0.0, "losses": [0.9] * 10},
        {"depth": 2, "beta": 1.0, "losses": [0.5] * 9 + [0.3]},
    ]
    assert depth_gaps(runs) == {2: pytest.approx(0.6)}  # tail of 1 step: 0.9 - 0.3
    assert spearman([0.0, 0.5, 1.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert math.isnan(spearman([0.0, 0.5, 1.0], [2.0, 2.0, 2.0]))  # no order to compare


def test_unit_values_survive_a_weights_only_load(tmp_path):
    gd = GradientDescentRun(
        beta=0.5, seed=3, lr=0.1, steps=1, losses=[1.0, math.nan], spectra_steps=[0, 1],
        sigma_min=[0.1, 0.2],
        sigma_max=[1.0, 2.0], residual_sigma_min=[0.3, 0.4], residual_sigma_max=[1.5, 2.5],
        squared_ratio=[0.01, 0.01], residual_squared_ratio=[0.04, 0.03], diverged=True,
        seconds=1.5,
    )  # fmt: skip
    depth = DepthRun(2, 1.0, 3, "pretrained layers 0-1", [0.7, 0.6], 0.25, 0.55, 4.0)
    torch.save({"gd": run_to_dict(gd), "depth": depth_run_to_dict(depth)}, tmp_path / "u.pt")
    loaded = torch.load(tmp_path / "u.pt", weights_only=True)
    rebuilt = GradientDescentRun(**loaded["gd"])
    assert math.isnan(rebuilt.losses[1])
    assert replace(rebuilt, losses=[1.0]) == replace(gd, losses=[1.0])
    assert DepthRun(**loaded["depth"]) == depth


# --- the committed full-mode results (3 seeds, written before this claim record) ------------


def _committed() -> dict:
    return json.loads(DESIGN_1.read_text())


def _t_interval(values: list[float]) -> tuple[float, float]:
    mean, spread = float(np.mean(values)), float(np.std(values, ddof=1))
    half = stats.t.ppf(0.975, len(values) - 1) * spread / math.sqrt(len(values))
    return mean - half, mean + half


def test_claims_from_committed_results_recompute_independently():
    payload = _committed()
    claims = claims_from_results(payload)
    assert len(claims) == 5
    rows = payload["data"]["one_layer_fits"]["full_curve"]
    seeds = [0, 1, 2]

    # Claim 1: per seed, min over beta > 0 of R^2, a diverged run or rate_high >= 1 as 0.
    linear = []
    for seed in seeds:
        values = []
        for row in rows:
            if row["seed"] == seed and row["beta"] > 0:
                broken = row["diverged"] or row["rate_high"] >= 1
                values.append(0.0 if broken else row["r_squared"])
        linear.append(min(values))
    assert claims[0].per_seed == pytest.approx(linear)
    assert claims[0].interval == pytest.approx(_t_interval(linear))
    assert claims[0].threshold.bounds == (0.9, math.inf)

    # Claim 3: per seed, log10(min over beta > 0 of the floor / the floor at beta 0).
    decades = []
    for seed in seeds:
        floor = {r["beta"]: r["residual_sigma_min_min"] for r in rows if r["seed"] == seed}
        decades.append(math.log10(min(v for b, v in floor.items() if b > 0) / floor[0.0]))
    assert claims[2].per_seed == pytest.approx(decades)
    assert claims[2].interval == pytest.approx(_t_interval(decades))

    # Claim 4: per seed, Spearman(beta, 1 - rate) over the five betas.
    speed = []
    for seed in seeds:
        chosen = sorted((r for r in rows if r["seed"] == seed), key=lambda r: r["beta"])
        speed.append(
            stats.spearmanr([r["beta"] for r in chosen], [1 - r["rate"] for r in chosen]).statistic
        )
    assert claims[3].per_seed == pytest.approx(speed)

    # Claim 5: per seed, the gap of the last-20-step mean loss (200 steps), beta 0 minus 1,
    # and its smallest increase from depth 2 to 6 to 10.
    growth = []
    for seed in seeds:
        tail = {
            (r["depth"], r["beta"]): sum(r["losses"][-20:]) / 20
            for r in payload["data"]["depth_runs"]
            if r["seed"] == seed
        }
        gap = [tail[(d, 0.0)] - tail[(d, 1.0)] for d in (2, 6, 10)]
        growth.append(min(gap[1] - gap[0], gap[2] - gap[1]))
    assert claims[4].per_seed == pytest.approx(growth)
    assert claims[4].interval == pytest.approx(_t_interval(growth))

    # Every check's quantity was stored in the old payload: nothing is untested, and
    # the verdicts follow from the intervals above.
    for claim in claims:
        assert claim.n == 3 and not claim.preview
        assert all(check.value is not None and check.passed for check in claim.checks)
        assert "(here: " in claim.statement
    assert [claim.verdict for claim in claims] == [
        "inconclusive",  # R^2 interval [0.879, 0.917] straddles 0.9
        "not reproduced",
        "reproduced",
        "not reproduced",
        "reproduced",
    ]


def test_a_check_quantity_that_was_not_stored_makes_the_claim_untested():
    payload = copy.deepcopy(_committed())
    for row in payload["data"]["one_layer_fits"]["full_curve"]:
        del row["squared_ratio_mean"]
    claims = claims_from_results(payload)
    # The collapse check backs claims 2 and 3; the effects are still reported.
    assert [c.verdict for c in claims] == [
        "inconclusive", "untested", "untested", "not reproduced", "reproduced",
    ]  # fmt: skip
    collapse = [c for c in claims[2].checks if c.name.startswith("softmax collapses")]
    assert collapse[0].value is None and "not measured" in collapse[0].note
    assert claims[2].effect == pytest.approx(claims_from_results(_committed())[2].effect)

    for row in payload["data"]["one_layer_fits"]["full_curve"]:
        del row["initial_loss"]
    assert [c.verdict for c in claims_from_results(payload)[:4]] == ["untested"] * 4


def test_rescore_of_the_committed_folder(tmp_path):
    folder = tmp_path / "residual-full"
    folder.mkdir()
    (folder / "results.json").write_text(COMMITTED.read_text())
    result = rescore(folder)
    written = json.loads((folder / "results.json").read_text())
    assert [c["verdict"] for c in written["claims"]] == [c.verdict for c in result.claims]
    report = (folder / "report.md").read_text()
    for claim in result.claims:
        assert f"| {claim.statement} | {claim.verdict} |" in report


# --- runs ---------------------------------------------------------------------------------


def _assert_preview_claims(claims) -> None:
    assert len(claims) == 11  # 3 per regime (2 fixed, 1 tuned), the sigma_min floor, depth
    for claim in claims:
        assert claim.checks, claim.statement
        assert claim.n == 1 and claim.preview
        assert claim.verdict in VERDICTS
        assert claim.interval is None
        assert claim.effect is not None and math.isfinite(claim.effect)


def test_smoke_run_writes_a_report(tmp_path):
    result = run(Config.for_mode("smoke"), tmp_path, progress=False)
    report = write_study(result, tmp_path)
    assert report.is_file()
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["name"] == "residual"
    _assert_preview_claims(result.claims)
    # run() scores its claims with the same function a rescore uses.
    assert [c.to_json() for c in claims_from_results(payload)] == payload["claims"]
    for figure in result.figures:
        assert_drawn_figure(tmp_path / figure)
    one_layer = result.data["one_layer_runs"]
    assert [(run["lr"], run["beta"]) for run in one_layer] == [
        (0.1, 0.0), (0.1, 0.5), (0.1, 1.0), (0.01, 0.0), (0.01, 0.5), (0.01, 1.0),
    ]  # fmt: skip
    for entry in one_layer:
        assert len(entry["losses"]) == 31
        assert all(math.isfinite(value) for value in entry["losses"])
    # beta X + Attn(X) at beta = 0 is Attn(X) itself.
    zero = one_layer[0]
    assert zero["residual_sigma_min"] == pytest.approx(zero["sigma_min"])
    # Tuning: every (beta, lr) of the grid once; the selected lr has the lowest final loss.
    tuning = result.data["lr_tuning"]
    assert sorted((row["beta"], row["lr"]) for row in tuning) == [
        (beta, lr) for beta in (0.0, 0.5, 1.0) for lr in (0.1, 0.3)
    ]
    tuned = result.data["tuned_runs"]
    for beta in (0.0, 0.5, 1.0):
        rows = [row for row in tuning if row["beta"] == beta]
        best = min(
            (r for r in rows if math.isfinite(r["final_loss"])), key=lambda r: r["final_loss"]
        )["lr"]
        assert [row["lr"] for row in rows if row["selected"]] == [best]
        assert [(run["lr"], run["steps"]) for run in tuned if run["beta"] == beta] == [(best, 30)]
    depth = result.data["depth_runs"]
    assert {(run["depth"], run["beta"]) for run in depth} == {
        (1, 0.0),
        (1, 1.0),
        (2, 0.0),
        (2, 1.0),
    }
    assert all(len(run["losses"]) == 3 for run in depth)


def test_step_size_selection_takes_the_best_worst_case_over_seeds():
    def row(lr, seed, loss):
        return {"lr": lr, "seed": seed, "final_loss": loss, "diverged": not math.isfinite(loss)}

    rows = [
        row(1.0, 0, 0.01), row(1.0, 1, math.inf),  # best on seed 0, diverged from seed 1
        row(0.5, 0, 0.10), row(0.5, 1, 0.30),  # worst case 0.30
        row(0.2, 0, 0.25), row(0.2, 1, 0.20),  # worst case 0.25: selected
        row(0.1, 0, 0.25), row(0.1, 1, 0.25),  # the same worst case as 0.2
    ]  # fmt: skip
    assert study.select_step_size(rows[:6]) == 0.2
    # A tie in the worst case goes to the smaller step.
    assert study.select_step_size(rows) == 0.1
    # A run flagged diverged counts as lost even with a finite last loss.
    flagged = [{**rows[4], "diverged": True}, rows[5], rows[2], rows[3]]
    assert study.select_step_size(flagged) == 0.5
    assert math.isnan(study.select_step_size(rows[:2]))


def test_the_selection_seeds_must_not_be_reported_seeds():
    with pytest.raises(ValueError, match=r"selection_seeds=\(1, 7\) share \[1\] with seeds"):
        Config(seeds=(0, 1), selection_seeds=(1, 7))
    with pytest.raises(ValueError, match="selection_seeds is empty"):
        Config(selection_seeds=())


def test_the_speed_plot_draws_when_every_run_diverged(tmp_path):
    from convergent.studies.residual_claims import Regime
    from convergent.studies.residual_plots import plot_speed_against_ratio

    runs = [
        run_to_dict(GradientDescentRun(beta, 0, 0.1, 4, losses=[1.0, math.inf], diverged=True))
        | {"residual_sigma_min": [0.1], "squared_ratio": [0.1], "residual_squared_ratio": [0.1]}
        for beta in (0.0, 1.0)
    ]
    config = {"seeds": [0], "transient_fraction": 0.1}
    regime = Regime.of(config, runs, 0.1, 4)
    assert_drawn_figure(plot_speed_against_ratio(regime, tmp_path / "speed.png"))


def test_smoke_run_resumes_from_its_units(tmp_path, monkeypatch):
    config = Config.for_mode("smoke")
    first = run(config, tmp_path, progress=False)
    units = sorted((tmp_path / "units").glob("*.pt"))
    # 2 regimes x 3 betas, 2 tuning lrs x 3 betas, 3 tuned runs, 2 depths x 2 betas; one seed
    assert len(units) == 6 + 6 + 3 + 4
    stamps = [path.stat().st_mtime_ns for path in units]

    def refuse(*args, **kwargs):
        raise AssertionError("a finished unit was computed again")

    monkeypatch.setattr(study, "train_one_beta", refuse)
    monkeypatch.setattr(study, "train_one_depth", refuse)
    second = run(config, tmp_path, progress=False)
    assert [c.to_json() for c in second.claims] == [c.to_json() for c in first.claims]
    assert json_ready(second.data) == json_ready(first.data)
    assert second.tables == first.tables
    assert [path.stat().st_mtime_ns for path in units] == stamps

    # A field that changes what a unit computes makes every unit new.
    monkeypatch.undo()
    computed: list[str] = []
    for name in ("train_one_beta", "train_one_depth"):
        original = getattr(study, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            computed.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(study, name, counting)
    changed = run(replace(config, regimes=((0.05, 30),)), tmp_path, progress=False)
    assert sorted(computed) == ["train_one_beta"] * (3 + 6 + 3) + ["train_one_depth"] * 4
    assert len(list((tmp_path / "units").glob("*.pt"))) == 19 + 16
    assert changed.data["one_layer_runs"][1]["losses"] != first.data["one_layer_runs"][1]["losses"]


def test_quick_run(tmp_path):
    """The one real-data study that runs at quick size in the default suite, so CI runs it."""
    result = run(Config.for_mode("quick"), tmp_path, progress=False)
    write_study(result, tmp_path)
    _assert_preview_claims(result.claims)
    assert all(check.value is not None for claim in result.claims for check in claim.checks)
    payload = json.loads((tmp_path / "results.json").read_text())
    assert [c.to_json() for c in claims_from_results(payload)] == payload["claims"]


def test_part_a_on_two_workers_matches_one(tmp_path):
    config = replace(Config.for_mode("smoke"), run_depth=False, regimes=((0.1, 8),), tuned_steps=8)
    alone = run(config, tmp_path / "one", progress=False)
    parallel = run(replace(config, workers=2), tmp_path / "two", progress=False)

    def without_seconds(runs: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in runs]

    for key in ("one_layer_runs", "tuned_runs"):
        assert without_seconds(parallel.data[key]) == without_seconds(alone.data[key])
    assert parallel.data["lr_tuning"] == alone.data["lr_tuning"]
    with pytest.raises(ValueError, match="workers=0 is out of range"):
        replace(config, workers=0)
