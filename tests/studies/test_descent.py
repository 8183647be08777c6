from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from scipy import stats

from convergent.studies import VERDICTS, write_study
from convergent.studies.descent import DESIGN, STUDY, Config, claims_from_results
from convergent.studies.descent import language as descent_language
from convergent.studies.descent import runs as descent_runs
from convergent.studies.descent.checks import constraints_acted
from convergent.studies.descent.measures import dual_trajectory, multiplier_activity
from convergent.studies.descent.runs import video_crops
from convergent.studies.descent.selection import denoising_score, robust_score, selected_index
from convergent.studies.framework import run_config
from tests.conftest import assert_drawn_figure

RESULTS = Path(__file__).parents[2] / "docs" / "results" / "descent-full"
COMMITTED = RESULTS / "results.json"
# The full results of earlier designs, each with the claims it was scored with.
HISTORY = sorted((RESULTS / "history").glob("design*.results.json*"))


def design2_rescored() -> dict[str, Any]:
    """Design 2's full run (seeds 1-5) scored by design 3's tests: every claim exploratory."""
    payload = json.loads((RESULTS / "history" / "design2.results.json").read_text())
    payload["claims"] = [claim.to_json() for claim in claims_from_results(payload)]
    return payload


def test_configs_for_every_mode():
    assert Config.for_mode("smoke").text_layers == 2
    full = Config.for_mode("full")
    # Design 3 reads seeds no earlier design read (design 1: 0-2, design 2: 0 and 1-5), and its
    # grid runs train as long as its final runs.
    assert full.seeds == (21, 22, 23, 24, 25) and full.selection_seed == 20
    assert full.text_grid_steps == full.text_steps and full.video_grid_steps == full.video_steps
    assert full.constrained_costs == (10.0, 1000.0, None) and full.constrained_alphas == (0.05, 0.2)
    sizes = {len(list(itertools.product(*axes.values()))) for axes in full.grids().values()}
    assert sizes == {6}
    assert Config.for_mode("quick").mode == "quick"
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")
    with pytest.raises(ValueError, match="selection_seed 0 is also a final seed"):
        Config(seeds=(0, 1))
    with pytest.raises(ValueError, match="both grids must have the same number of points"):
        Config(constrained_alphas=(0.05, 0.2, 0.3))
    with pytest.raises(ValueError, match=r"every alpha must be in \[0, 1\), got 1.5"):
        Config(constrained_alphas=(1.5,))
    with pytest.raises(ValueError, match="every resilient cost must be > 0 or None"):
        Config(constrained_costs=(0.0, None))


def test_options_give_erm_its_own_lr_and_decay_and_the_constrained_model_its_constraints():
    config = Config(text_lr=1e-4, video_lr=1e-3, erm_lrs=(5e-5,), weight_decay=0.01)
    (erm_point,) = [p for p in [{"lr_scale": 0.5, "weight_decay": 0.1}]]
    assert config.options("erm", erm_point, "text") == {
        "lr": pytest.approx(5e-5),
        "weight_decay": 0.1,
        "alpha": 0.0,
        "resilient_cost": None,
    }
    assert config.options("erm", erm_point, "video")["lr"] == pytest.approx(5e-4)
    point = {"resilient_cost": None, "alpha": 0.2}
    assert config.options("constrained", point, "video") == {
        "lr": 1e-3,
        "weight_decay": 0.01,
        "alpha": 0.2,
        "resilient_cost": None,
    }
    # A constrained point carries ERM's selected lr scale and weight decay.
    inherited = {"resilient_cost": 10.0, "alpha": 0.05, "lr_scale": 2.0, "weight_decay": 0.1}
    assert config.options("constrained", inherited, "text") == {
        "lr": pytest.approx(2e-4),
        "weight_decay": 0.1,
        "alpha": 0.05,
        "resilient_cost": 10.0,
    }


def test_video_crops_are_token_grids_of_the_frames():
    frames = torch.arange(2 * 8 * 8, dtype=torch.uint8).reshape(2, 8, 8)
    crops = video_crops(frames, 3, crop=4, patch=2, generator=torch.Generator().manual_seed(0))
    assert crops.shape == (3, 4, 4)
    # the first token of a crop is its top-left 2x2 block, row by row
    first = crops[0, 0] * 255
    assert first[1] - first[0] == 1 and first[2] - first[0] == 8
    with pytest.raises(ValueError, match="multiple of the patch size"):
        video_crops(frames, 1, crop=5, patch=2, generator=torch.Generator())


def test_multiplier_activity_reads_the_largest_lambda_and_the_active_steps():
    history = [
        {"step": 1, "split": "train", "loss": 0.9, "lambda_1": 0.0, "lambda_2": 0.0, "u_1": 5.0},
        {"step": 2, "split": "train", "loss": 0.8, "lambda_1": 0.0, "lambda_2": 0.3},
        {"step": 3, "split": "train", "loss": 0.7, "lambda_1": 0.25, "lambda_2": 0.1},
        {"step": 3, "split": "validation", "lambda_1": 9.0},  # not a training step
        {"step": 4, "split": "train", "loss": 0.6, "lambda_1": 0.0, "lambda_2": 0.0},
    ]
    activity = multiplier_activity(history)
    assert activity["multiplier_max"] == pytest.approx(0.3)  # u_1 and validation ignored
    assert activity["multiplier_active_share"] == pytest.approx(2 / 4)
    erm = [{"step": 1, "split": "train", "loss": 0.9}]
    assert multiplier_activity(erm) == {"multiplier_max": None, "multiplier_active_share": None}


def test_dual_trajectory_keeps_every_layers_series_at_evenly_spaced_steps():
    history = [
        {
            "step": t,
            "split": "train",
            "lambda_1": 0.1 * t,
            "lambda_2": 0.0,
            "u_1": t,
            "u_2": 0.0,
            "slack_1": -t,
            "slack_2": 1.0,
        }
        for t in range(1, 11)
    ] + [{"step": 10, "split": "validation", "lambda_1": 99.0}]
    full = dual_trajectory(history, points=100)
    assert full["steps"] == list(range(1, 11))
    assert full["lambda"][0] == pytest.approx([0.1 * t for t in range(1, 11)])
    assert full["u"][0] == list(range(1, 11)) and full["slack"][1] == [1.0] * 10
    thinned = dual_trajectory(history, points=4)
    # indices 0, 2.5 -> 2, 5 and the last record: steps 1, 3, 6, 10
    assert thinned["steps"] == [1, 3, 6, 10]
    assert len(thinned["lambda"]) == 2 and len(thinned["lambda"][1]) == 4
    erm = dual_trajectory([{"step": 1, "split": "train", "loss": 0.5}])
    assert erm == {"steps": [], "lambda": [], "u": [], "slack": []}
    hard = dual_trajectory([{"step": 1, "split": "train", "lambda_1": 0.2, "slack_1": 0.1}])
    assert hard["u"] == [] and hard["slack"] == [[0.1]]


def test_selection_scores_skip_points_that_give_up_clean_quality():
    units = [
        {"validation_clean": 0.90, "validation_robust": 0.70},
        {"validation_clean": 0.89, "validation_robust": 0.75},  # exactly 1 point below: kept
        {"validation_clean": 0.8899, "validation_robust": 0.85},  # just beyond: skipped
        {"validation_clean": math.nan, "validation_robust": math.nan},  # diverged
    ]
    score = robust_score(units, tolerance=0.01)
    values = [score(u) for u in units]
    assert values[:2] == [0.70, 0.75] and all(math.isnan(v) for v in values[2:])
    videos = [
        {"validation_rmse_train_noise": 0.050, "validation_rmse_selection": 0.09},
        {"validation_rmse_train_noise": 0.0505, "validation_rmse_selection": 0.08},  # 1 %: kept
        {"validation_rmse_train_noise": 0.0506, "validation_rmse_selection": 0.05},  # skipped
    ]
    score = denoising_score(videos, tolerance=0.01)
    values = [score(u) for u in videos]
    assert values[:2] == [0.09, 0.08] and math.isnan(values[2])


def test_the_denoiser_floor_admits_the_points_where_the_constraints_bind():
    # Design 2's constrained grid (selection seed): RMSE at the training noise, at 2x, the
    # largest lambda and the share of steps with an active constraint.
    grid = [
        (10.0, 0.05, 0.04817, 0.07019, 0.062, 0.61),
        (10.0, 0.2, 0.04929, 0.07000, 0.162, 0.30),  # binds: 2.3 % above the best RMSE
        (1000.0, 0.05, 0.04816, 0.06999, 0.071, 0.32),
        (1000.0, 0.2, 0.06263, 0.07274, 0.635, 0.51),  # binds, 30 % above
        (None, 0.05, 0.04817, 0.06999, 0.071, 0.30),
        (None, 0.2, 0.06310, 0.07310, 0.482, 1.00),  # binds, 31 % above
    ]
    units: list[dict[str, Any]] = [
        {
            "resilient_cost": cost,
            "alpha": alpha,
            "validation_rmse_train_noise": clean,
            "validation_rmse_selection": shifted,
            "multiplier_max": peak,
            "multiplier_active_share": share,
        }
        for cost, alpha, clean, shifted, peak, share in grid
    ]
    binds = [u["multiplier_max"] >= 0.1 and u["multiplier_active_share"] >= 0.2 for u in units]
    assert binds == [False, True, False, True, False, True]
    # Design 2's floor, over every point: within 1 % of 0.04816. No binding point is in it.
    old_ceiling = 1.01 * min(u["validation_rmse_train_noise"] for u in units)
    old = [u["validation_rmse_train_noise"] <= old_ceiling for u in units]
    assert not any(o and b for o, b in zip(old, binds, strict=True))
    # Design 3's floor: within 1 % of the best binding point (0.04929), binding points only.
    score = denoising_score(units, tolerance=0.01)
    values = [score(u) for u in units]
    assert values[1] == 0.07000 and all(math.isnan(v) for i, v in enumerate(values) if i != 1)
    assert selected_index(units, score) == 1
    # A grid where nothing binds (ERM's: no multipliers) keeps design 2's rule.
    erm = [{**u, "multiplier_max": None, "multiplier_active_share": None} for u in units]
    score = denoising_score(erm, tolerance=0.01)
    assert [not math.isnan(score(u)) for u in erm] == old
    assert selected_index(erm, score) == 2  # ties at 0.06999: the first


def test_a_diverged_run_is_a_nan_unit_that_selection_skips(monkeypatch):
    from convergent.train import TrainingDiverged

    def diverge(*args, **kwargs):
        raise TrainingDiverged("the training loss is nan at step 3")

    monkeypatch.setattr(descent_runs, "train_model", diverge)
    config = Config.for_mode("smoke")
    point = {"lr_scale": 1.0, "weight_decay": 0.01}
    grid = descent_runs.video_unit(config, "erm", point, 0, final=False)
    assert grid["diverged"] and math.isnan(grid["validation_rmse_selection"])
    good = {"validation_rmse_train_noise": 0.05, "validation_rmse_selection": 0.08}
    score = denoising_score([grid, good], tolerance=0.01)
    assert math.isnan(score(grid)) and score(good) == 0.08
    final = descent_runs.video_unit(config, "erm", point, 1, final=True)
    assert len(final["rmse"]) == len(config.noise_multiples)
    assert len(final["layer_losses"]) == config.denoiser_layers + 1
    assert all(math.isnan(value) for value in [*final["rmse"], *final["layer_losses"]])


def test_constraints_acted_needs_every_seed_measured():
    measured = constraints_acted(
        [
            {"multiplier_max": 0.5, "multipliers": [0.0]},
            {"multiplier_max": 0.05, "multipliers": []},
        ],
        "text",
    )
    assert measured.value == pytest.approx(0.05) and measured.passed is False
    passed = constraints_acted([{"multiplier_max": 0.2}, {"multiplier_max": 0.15}], "text")
    assert passed.value == pytest.approx(0.15) and passed.passed is True
    # a diverged seed records no multiplier: not measured, whatever the other seeds did
    diverged = constraints_acted([{"multiplier_max": 0.5}, {"multiplier_max": None}], "video")
    assert diverged.value is None and diverged.passed is None
    assert "diverged" in diverged.note


def _t_interval(values: list[float]) -> tuple[float, float]:
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return statistics.fmean(values) - half, statistics.fmean(values) + half


def test_committed_results_rescore_to_their_stored_claims():
    payload = json.loads(COMMITTED.read_text())
    # The committed run is design 3's own, on seeds no earlier design read: nothing exploratory.
    assert payload["data"]["design"] == DESIGN == 3
    claims = claims_from_results(payload)
    assert [c.to_json() for c in claims] == payload["claims"]
    assert not any(claim.exploratory for claim in claims)
    assert payload["config"]["seeds"] == [21, 22, 23, 24, 25]
    assert sum(claim.statement.startswith("(c) ") for claim in claims) == 3


def test_design_two_rescored_is_exploratory_throughout():
    payload = design2_rescored()
    assert payload["data"]["design"] == 2
    assert all(claim["exploratory"] for claim in payload["claims"])
    assert not any(claim["statement"].startswith("(c)") for claim in payload["claims"])


def test_earlier_designs_are_refused_with_one_clear_sentence():
    payload = json.loads(HISTORY[0].read_text())  # design 1: no design key
    with pytest.raises(ValueError) as refused:
        claims_from_results(payload)
    message = str(refused.value)
    assert message == (
        f"these descent results are of design 1 (no design number), and this code scores "
        f"design {DESIGN} and, exploratory, design 2's data only; earlier designs' full results, "
        "with the claims they were scored with, are in docs/results/descent-full/history/"
    )
    later = {**payload, "data": {**payload["data"], "design": DESIGN + 1}}
    with pytest.raises(ValueError, match=f"of design {DESIGN + 1}, and this code scores"):
        claims_from_results(later)


def test_design_two_payloads_score_exploratory_and_design_three_payloads_do_not():
    earlier = _payload(design=2)
    assert all(claim.exploratory for claim in claims_from_results(earlier))
    current = _payload(design=DESIGN)
    assert not any(claim.exploratory for claim in claims_from_results(current))


def test_every_history_file_holds_the_claims_it_was_scored_with():
    assert [path.name for path in HISTORY] == ["design1.results.json", "design2.results.json"]
    for path in HISTORY:
        payload = json.loads(path.read_text())
        assert payload["name"] == "descent" and payload["mode"] == "full"
        assert payload["data"].get("design", 1) != DESIGN
        assert payload["claims"]
        assert all(claim["verdict"] in VERDICTS for claim in payload["claims"])
        assert not any(claim.get("exploratory") for claim in payload["claims"])  # as scored then
    # Design 2's history file holds its own runs, apart from design 3's.
    design2 = json.loads(HISTORY[1].read_text())
    assert design2["config"]["seeds"] != json.loads(COMMITTED.read_text())["config"]["seeds"]


# Which of 10 test sentences each made-up final text run classified correctly, per seed.
ERM_MARKS = ("1111111100", "1111111110", "1111111000")
CONSTRAINED_MARKS = ("1111111010", "1111111100", "1111110001")


def _payload(design: int = DESIGN) -> dict:
    """Three seeds of made-up final runs; design 3's text runs mark their test sentences,
    design 2's do not."""
    levels = {"gaussian": [0.5, 1.0], "typos": [0.1, 0.2]}

    def text_record(seed, marks, gaussian, typos, losses, active=0.5):
        increases = [b - a for a, b in itertools.pairwise(losses)]
        return {
            "seed": seed,
            "clean": marks.count("1") / len(marks),
            **({"clean_correct": marks} if design >= 3 else {}),
            "gaussian": gaussian,
            "typos": typos,
            "layer_losses": losses,
            "largest_increase": max(increases),
            "multiplier_max": 0.4,
            "multiplier_active_share": active,
            "multipliers": [0.1],
            "fraction_satisfied": 1.0,
            "train_fraction_satisfied": 1.0,
        }

    erm_marks, con_marks = ERM_MARKS, CONSTRAINED_MARKS
    text = {
        "levels": levels,
        "runs": {
            "erm": [
                text_record(1, erm_marks[0], [0.70, 0.60], [0.75, 0.70], [0.70, 0.60, 0.65]),
                text_record(2, erm_marks[1], [0.72, 0.58], [0.76, 0.71], [0.70, 0.62, 0.66]),
                text_record(3, erm_marks[2], [0.69, 0.61], [0.74, 0.69], [0.70, 0.61, 0.62]),
            ],
            "constrained": [
                text_record(1, con_marks[0], [0.74, 0.66], [0.75, 0.71], [0.70, 0.60, 0.55]),
                text_record(2, con_marks[1], [0.73, 0.62], [0.77, 0.70], [0.70, 0.58, 0.57]),
                text_record(3, con_marks[2], [0.72, 0.64], [0.74, 0.70], [0.70, 0.59, 0.60], 0.1),
            ],
        },
    }
    multiples = [1.0, 2.0, 3.0]

    def video_record(seed, rmse, losses):
        record = text_record(seed, "1", [], [], losses)
        return {**record, "rmse": rmse}

    video = {
        "sigmas": [0.1, 0.2, 0.3],
        "runs": {
            "erm": [video_record(s, [0.05, 0.08, 0.12], [0.1, 0.05, 0.04]) for s in (1, 2, 3)],
            "constrained": [
                video_record(1, [0.05, 0.07, 0.12], [0.1, 0.05, 0.04]),
                video_record(2, [0.05, 0.078, 0.11], [0.1, 0.05, 0.04]),
                video_record(3, [0.05, 0.08, 0.13], [0.1, 0.05, 0.04]),
            ],
        },
    }
    return {
        "config": {"noise_multiples": multiples, "clean_tolerance": 0.01},
        "data": {"design": design, "text": text, "video": video},
    }


def test_claims_follow_their_formulas():
    payload = _payload()
    claims = claims_from_results(payload)
    assert len(claims) == 2 + 2 + 1 + 2  # clean x2, two kinds, monotone; video x2
    erm = payload["data"]["text"]["runs"]["erm"]
    con = payload["data"]["text"]["runs"]["constrained"]
    clean = [c["clean"] - e["clean"] for e, c in zip(erm, con, strict=True)]
    assert list(claims[0].per_seed) == pytest.approx(clean)  # 0, -0.1, 0
    assert claims[0].threshold.value == pytest.approx(-0.003)
    assert claims[1].threshold.value == pytest.approx(-0.01)
    # The clean interval spans sentences and seeds: the two-way interval of the marks' table.
    table = [
        [int(b) - int(a) for a, b in zip(e, c, strict=True)]
        for e, c in zip(ERM_MARKS, CONSTRAINED_MARKS, strict=True)
    ]
    low, high = _crossed_by_hand(table)
    assert claims[0].interval == pytest.approx((low, high))
    assert claims[0].interval != pytest.approx(_t_interval(clean))
    assert "sentences and seeds" in claims[0].interval_method
    found = claims[0].extra["resolution"]
    assert found["half_width"] == pytest.approx((high - low) / 2)
    assert found["seed_half_width"] == pytest.approx(
        (_t_interval(clean)[1] - _t_interval(clean)[0]) / 2
    )
    assert found["sentences"] == 10 and found["resolvable"] is False
    assert claims[0].revised and claims[5].revised and claims[2].revised
    gaussian = [
        sum(c["gaussian"]) / 2 - sum(e["gaussian"]) / 2 for e, c in zip(erm, con, strict=True)
    ]
    assert "gaussian" in claims[2].statement
    assert list(claims[2].per_seed) == pytest.approx(gaussian)
    assert claims[2].threshold.value == pytest.approx(0.01)
    # Monotone: the largest relative rise f_l / f_(l-1) - 1 against a 1 % tolerance.
    monotone = claims[4]
    assert monotone.threshold.value == pytest.approx(0.01)
    rises = [max(b / a - 1 for a, b in itertools.pairwise(c["layer_losses"])) for c in con]
    assert list(monotone.per_seed) == pytest.approx(rises)
    # ERM rises 0.05/0.60, 0.04/0.62, 0.01/0.61 (1.6 %): every seed has a bump over 1 %.
    assert monotone.checks[-1].value == pytest.approx(1.0) and monotone.checks[-1].passed
    # The active-share check takes the smallest seed: 0.1 < 0.2 fails every text claim.
    assert claims[0].checks[1].value == pytest.approx(0.1) and claims[0].checks[1].passed is False
    assert all(c.verdict == "untested" for c in claims[:5])
    # Video: worst relative RMSE reduction over the levels >= 2x.
    verm = payload["data"]["video"]["runs"]["erm"]
    vcon = payload["data"]["video"]["runs"]["constrained"]
    reduction = [
        min(1 - c["rmse"][i] / e["rmse"][i] for i in (1, 2))
        for e, c in zip(verm, vcon, strict=True)
    ]
    assert list(claims[5].per_seed) == pytest.approx(reduction)
    assert claims[5].checks[1].passed is True  # every video seed active half the steps
    # Video ERM's losses fall at every layer: no room to show the contrast, untested.
    assert claims[6].checks[-1].value == 0.0 and claims[6].verdict == "untested"


def test_design_two_data_gets_the_seed_level_interval_and_its_resolution():
    claims = claims_from_results(_payload(design=2))
    clean = list(claims[0].per_seed)
    assert claims[0].interval == pytest.approx(_t_interval(clean))
    assert "seed-level interval" in claims[0].statement
    for claim, margin in zip(claims[:2], (0.003, 0.01), strict=True):
        found = claim.extra["resolution"]
        half = stats.t.ppf(0.975, 2) * statistics.stdev(clean) / math.sqrt(3)
        assert found["half_width"] == pytest.approx(half) and found["interval"] is None
        assert found["resolvable"] is bool(half <= margin)
        # The fewest seeds whose expected seed-level half-width reaches the margin.
        sd = statistics.stdev(clean)
        needed = next(
            n for n in range(2, 10**5) if stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) <= margin
        )
        assert found["seeds_needed"] == needed
        assert f"about {needed} seeds" in claim.evidence and "unresolvable" in claim.evidence


def _crossed_by_hand(table: Sequence[Sequence[float]]) -> tuple[float, float]:
    """The interval over seeds and sentences, written out: Var(mean) = var_a / N + var_b / n +
    var_e / (N n) from the two-way mean squares with Satterthwaite's df; where a component's
    estimate is below zero, the conservative (MS_sentences + MS_seeds) / (N n) instead (no
    term is dropped)."""
    n, big_n = len(table), len(table[0])
    grand = sum(map(sum, table)) / (n * big_n)
    rows = [sum(row) / big_n for row in table]
    columns = [sum(table[s][i] for s in range(n)) / n for i in range(big_n)]
    ms_seeds = big_n * sum((r - grand) ** 2 for r in rows) / (n - 1)
    ms_sentences = n * sum((c - grand) ** 2 for c in columns) / (big_n - 1)
    ms_rest = sum(
        (table[s][i] - rows[s] - columns[i] + grand) ** 2 for s in range(n) for i in range(big_n)
    ) / ((n - 1) * (big_n - 1))
    var_a, var_b = (ms_sentences - ms_rest) / n, (ms_seeds - ms_rest) / big_n
    if var_a >= 0 and var_b >= 0:
        variance = var_a / big_n + var_b / n + ms_rest / (big_n * n)
        rest = (n - 1) * (big_n - 1)
        pieces = [(ms_sentences, big_n - 1), (ms_seeds, n - 1), (-ms_rest, rest)]
    else:
        variance = (ms_sentences + ms_seeds) / (big_n * n)
        pieces = [(ms_sentences, big_n - 1), (ms_seeds, n - 1)]
    total = sum(value for value, _ in pieces)
    assert total / (n * big_n) == pytest.approx(variance)
    df = total**2 / sum(value**2 / freedom for value, freedom in pieces)
    half = stats.t.ppf(0.975, df) * math.sqrt(variance)
    return grand - half, grand + half


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("descent")
    config = Config.for_mode("smoke")
    result = run_config(STUDY, config, folder, progress=False)
    write_study(result, folder)
    return config, folder, result


def test_smoke_run_writes_a_report_with_every_table_claim_and_figure(smoke_run):
    config, folder, result = smoke_run
    assert (folder / "report.md").is_file()
    for figure in result.figures:
        assert_drawn_figure(folder / figure)
    assert len(result.claims) == 13  # (a) 8, (b) 2, (c) 3
    assert "language.png" in result.figures
    for claim in result.claims:
        assert claim.n == 1 and claim.preview and claim.interval is None
        assert claim.verdict in VERDICTS and claim.checks
        assert claim.effect is not None and math.isfinite(claim.effect)
        assert all(check.passed is not None for check in claim.checks)  # measured in a new run
    payload = json.loads((folder / "results.json").read_text())
    assert [c["statement"] for c in payload["claims"]] == [
        c.statement for c in claims_from_results(payload)
    ]
    text = payload["data"]["text"]["runs"]
    for method in ("erm", "constrained"):
        record = text[method][0]
        assert len(record["layer_losses"]) == 3  # MiniLM cut to 2 layers: f_0 .. f_2
        assert set(record) >= {
            "clean",
            "gaussian",
            "uniform",
            "discrete",
            "typos",
            "word_dropout",
            "fraction_satisfied",
            "train_fraction_satisfied",
            "trajectory",
        }
    assert len(text["constrained"][0]["multipliers"]) == 2
    for method in ("erm", "constrained"):  # one mark per test sentence, averaging to "clean"
        record = text[method][0]
        assert len(record["clean_correct"]) == config.test_examples
        assert set(record["clean_correct"]) <= {"0", "1"}
        marks = [int(mark) for mark in record["clean_correct"]]
        assert sum(marks) / len(marks) == pytest.approx(record["clean"])
    for part in ("text", "video"):
        constrained = payload["data"][part]["runs"]["constrained"][0]
        # the maximum during training bounds the final multipliers from above
        assert constrained["multiplier_max"] >= max(constrained["multipliers"])
        assert 0.0 <= constrained["multiplier_active_share"] <= 1.0
        assert payload["data"][part]["runs"]["erm"][0]["multiplier_max"] is None
    video = payload["data"]["video"]["runs"]
    assert len(video["erm"][0]["rmse"]) == len(config.noise_multiples)
    for part in ("text", "video"):
        selected = payload["data"][part]["selected"]
        for axis in ("lr_scale", "weight_decay"):  # the constrained grid ran at ERM's choice
            assert selected["constrained"][axis] == selected["erm"][axis]
            for point in payload["data"][part]["selection"]["constrained"]:
                assert point[axis] == selected["erm"][axis]


def test_smoke_run_resumes_from_its_units_and_recomputes_a_changed_config(smoke_run, monkeypatch):
    config, folder, first = smoke_run
    units = sorted((folder / "units").glob("*.pt"))
    # (text, video, language) x (erm, constrained) x (grid point, final seed), and the
    # language model's shared pretraining.
    assert len(units) == 13

    def no_training(*args, **kwargs):
        raise AssertionError("a finished unit was trained again")

    monkeypatch.setattr(descent_runs, "train_model", no_training)
    # Part (c) trains through its own imports: its fine-tunes and its pretraining's data.
    monkeypatch.setattr(descent_language, "train_model", no_training)
    monkeypatch.setattr(descent_language, "training_data", no_training)
    again = run_config(STUDY, config, folder, progress=False)
    assert sorted((folder / "units").glob("*.pt")) == units
    assert [c.to_json() for c in again.claims] == [c.to_json() for c in first.claims]
    assert json.dumps(again.data) == json.dumps(first.data)
    assert "13 unit(s) reused" in again.notes[-1]

    # A field that changes what a unit computes gives new units: training runs again.
    changed = dataclasses.replace(config, constrained_alphas=(0.1,))
    with pytest.raises(AssertionError, match="trained again"):
        run_config(STUDY, changed, folder, progress=False)
