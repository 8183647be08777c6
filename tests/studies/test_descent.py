from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from scipy import stats

from convergent.studies import VERDICTS, write_study
from convergent.studies import descent_parts as parts
from convergent.studies.descent import Config, claims_from_results, run
from convergent.studies.descent_claims import constraints_acted
from convergent.studies.descent_parts import multiplier_activity, video_crops
from tests.conftest import assert_drawn_figure

COMMITTED = Path(__file__).parents[2] / "docs" / "results" / "descent-full" / "results.json"


def test_configs_for_every_mode():
    assert Config.for_mode("smoke").text_layers == 2
    assert Config.for_mode("full").seeds == (0, 1, 2, 3, 4)
    assert Config.for_mode("quick").mode == "quick"
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")


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


def test_constraints_acted_needs_every_seed_and_only_lower_bounds_from_final_values():
    measured = constraints_acted(
        [
            {"multiplier_max": 0.5, "multipliers": [0.0]},
            {"multiplier_max": 0.05, "multipliers": []},
        ],
        "text",
    )
    assert measured.value == pytest.approx(0.05) and measured.passed is False
    # an older payload: only final multipliers, which bound the maximum from below
    passed = constraints_acted([{"multipliers": [0.2, 0.0]}, {"multipliers": [0.0, 0.15]}], "text")
    assert passed.value == pytest.approx(0.15) and passed.passed is True
    assert "lower bound" in passed.note
    unknown = constraints_acted([{"multipliers": [0.0, 0.0002]}], "video")
    assert unknown.value is None and unknown.passed is None
    assert "0.0002" in unknown.note and "not stored" in unknown.note


def _t_interval(values: list[float]) -> tuple[float, float]:
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return statistics.fmean(values) - half, statistics.fmean(values) + half


def test_committed_full_results_rescore_from_their_raw_numbers():
    payload = json.loads(COMMITTED.read_text())
    claims = claims_from_results(payload)
    assert len(claims) == 7
    text, video = payload["data"]["text"], payload["data"]["video"]
    by_seed = {
        part: {
            method: {r["seed"]: r for r in runs}
            for method, runs in payload["data"][part]["runs"].items()
        }
        for part in ("text", "video")
    }
    seeds = sorted(by_seed["text"]["erm"])
    assert seeds == [0, 1, 2]

    # Gaussian robustness: ERM's mean drop minus the constrained model's, paired by seed.
    def drop(record: dict, kind: str) -> float:
        return sum(record["clean"] - a for a in record[kind]) / len(record[kind])

    gaussian = [
        drop(by_seed["text"]["erm"][s], "gaussian")
        - drop(by_seed["text"]["constrained"][s], "gaussian")
        for s in seeds
    ]
    claim = claims[1]
    assert "gaussian" in claim.statement and "(here:" in claim.statement
    assert list(claim.per_seed) == pytest.approx(gaussian, abs=1e-12)
    assert claim.interval == pytest.approx(_t_interval(gaussian), abs=1e-12)

    # Out-of-distribution denoising: worst relative RMSE reduction over levels >= 2x.
    beyond = [i for i, m in enumerate(payload["config"]["noise_multiples"]) if m >= 2]
    assert beyond == [3, 4, 5]
    reduction = [
        min(
            1
            - by_seed["video"]["constrained"][s]["rmse"][i] / by_seed["video"]["erm"][s]["rmse"][i]
            for i in beyond
        )
        for s in seeds
    ]
    claim = claims[5]
    assert list(claim.per_seed) == pytest.approx(reduction, abs=1e-12)
    assert claim.interval == pytest.approx(_t_interval(reduction), abs=1e-12)

    # Clean accuracy: constrained minus ERM.
    clean = [
        by_seed["text"]["constrained"][s]["clean"] - by_seed["text"]["erm"][s]["clean"]
        for s in seeds
    ]
    assert list(claims[4].per_seed) == pytest.approx(clean, abs=1e-12)
    # Monotonicity: the constrained model's largest layer-to-layer increase of test loss.
    increases = [
        max(b - a for a, b in itertools.pairwise(losses))
        for losses in (by_seed["text"]["constrained"][s]["layer_losses"] for s in seeds)
    ]
    assert list(claims[0].per_seed) == pytest.approx(increases, abs=1e-6)

    assert all(c.n == 3 and not c.preview and c.verdict in VERDICTS for c in claims)
    # Part (b): the final multipliers (largest 0.0002) cannot show that the constraints
    # acted and the maximum during training was not stored, so both claims are untested.
    for claim in claims[5:]:
        assert claim.verdict == "untested"
        unstored = [c for c in claim.checks if c.passed is None]
        assert len(unstored) == 1 and "not stored" in unstored[0].note
    # Part (a): the final multipliers (>= 0.2 in every seed) pass as a lower bound.
    for claim in claims[:5]:
        assert claim.checks[0].passed is True and "lower bound" in claim.checks[0].note
    # Only 1 of 3 ERM runs had a bump in part (a): no room to show the contrast.
    assert claims[0].verdict == "untested"
    assert claims[0].checks[1].value == pytest.approx(1 / 3) and claims[0].checks[1].passed is False
    assert [c.verdict for c in claims[1:5]] == [
        "inconclusive",
        "not reproduced",
        "inconclusive",
        "inconclusive",
    ]
    assert text["test_examples"] == 1056 and len(video["sigmas"]) == 6


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("descent")
    config = Config.for_mode("smoke")
    result = run(config, folder, progress=False)
    write_study(result, folder)
    return config, folder, result


def test_smoke_run_writes_a_report_with_every_table_claim_and_figure(smoke_run):
    config, folder, result = smoke_run
    assert (folder / "report.md").is_file()
    for figure in result.figures:
        assert_drawn_figure(folder / figure)
    assert len(result.claims) == 7
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
        assert set(record) >= {"clean", "gaussian", "uniform", "discrete", "fraction_satisfied"}
    assert len(text["constrained"][0]["multipliers"]) == 2
    for part in ("text", "video"):
        constrained = payload["data"][part]["runs"]["constrained"][0]
        # the maximum during training bounds the final multipliers from above
        assert constrained["multiplier_max"] >= max(constrained["multipliers"])
        assert 0.0 <= constrained["multiplier_active_share"] <= 1.0
        assert payload["data"][part]["runs"]["erm"][0]["multiplier_max"] is None
    video = payload["data"]["video"]["runs"]
    assert len(video["erm"][0]["rmse"]) == len(config.noise_multiples)


def test_smoke_run_resumes_from_its_units_and_recomputes_a_changed_config(smoke_run, monkeypatch):
    config, folder, first = smoke_run
    units = sorted((folder / "units").glob("*.pt"))
    assert len(units) == 4  # (text, video) x (erm, constrained) x 1 seed

    def no_training(*args, **kwargs):
        raise AssertionError("a finished unit was trained again")

    monkeypatch.setattr(parts, "train_model", no_training)
    again = run(config, folder, progress=False)
    assert sorted((folder / "units").glob("*.pt")) == units
    assert [c.to_json() for c in again.claims] == [c.to_json() for c in first.claims]
    assert json.dumps(again.data) == json.dumps(first.data)
    assert "4 unit(s) reused" in again.notes[-1]

    # A field that changes what a unit computes gives new units: training runs again.
    changed = dataclasses.replace(config, alpha=0.1)
    with pytest.raises(AssertionError, match="trained again"):
        run(changed, folder, progress=False)
