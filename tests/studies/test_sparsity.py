"""The sparsity study: smoke run end to end, resume, claims re-scored from the committed full
results (and refused for an earlier design's), a sweep that never reads the test split, and
`convergent prune` on a run folder."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from scipy import stats
from torch.utils.data import Dataset

from convergent.commands import format_prune_summary, prune_run
from convergent.data import is_cached
from convergent.sparse import Masks
from convergent.studies import VERDICTS
from convergent.studies.framework import json_ready, write_study
from convergent.studies.sparsity import (
    Config,
    claims_from_results,
    pruned_score_of_good_dense,
    run,
)
from convergent.studies.sparsity import runs as sparsity_runs
from convergent.studies.sparsity.runs import LanguageJob, VisionJob
from convergent.train import load_checkpoint
from tests.conftest import assert_drawn_figure

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "sparsity-full"
# The full results of earlier designs, with the claims they were scored with (data only).
HISTORY = COMMITTED / "history"


def _needs(name: str) -> None:
    if shutil.which("apt-get") is None and not is_cached(name):
        pytest.skip(f"{name} needs apt-get (a Debian or Ubuntu machine) or a cached copy")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One smoke run, written to a folder that the resume test runs into again."""
    _needs("fashion-mnist")
    _needs("austen")
    folder = tmp_path_factory.mktemp("sparsity-smoke")
    config = Config.for_mode("smoke")
    result = run(config, folder, progress=False)
    write_study(result, folder)
    return config, folder, result


def _unit_files(folder: Path) -> list[str]:
    return sorted(path.name for path in (folder / "units").glob("*.pt"))


def test_smoke_study_runs_end_to_end(smoke_run):
    _, folder, result = smoke_run
    assert (folder / "report.md").is_file()
    for figure in result.figures:
        assert_drawn_figure(folder / figure)
    payload = json.loads((folder / "results.json").read_text())
    data = payload["data"]
    assert data["design"] == 2 and data["rms_fraction"] == 0.01
    vision, language = data["vision"], data["language"]
    assert set(vision["accuracy"]) == {"adamw", "ham", "horst"}
    for by_key in vision["accuracy"].values():
        assert set(by_key) == {"dense", "90%"}
        assert all(
            0.0 <= v <= 1.0 and len(values) == 1 for values in by_key.values() for v in values
        )
    for by_key in vision["achieved"].values():
        assert by_key["90%"][0] == pytest.approx(0.9, abs=1e-3)  # exact top-k
    # Each grid has the same number of points; the selection holds every point's score.
    assert {name: len(points) for name, points in vision["selection"].items()} == {
        "adamw": 1,
        "ham": 1,
        "horst": 1,
    }
    assert vision["selected"]["horst"] == {"lr": 2e-3, "alpha": 50.0}
    assert set(language["perplexity"]["horst"]) == {"0%", "50%", "90%"}
    # The manipulation checks' quantities are stored per run.
    assert vision["move_ratio"]["horst"]["90%"][0] > 0.0
    assert vision["selection"]["horst"][0]["move_ratio"] > 0.0
    assert vision["selection"]["adamw"][0]["move_ratio"] is None
    assert language["move_ratio"]["horst"][0] > 0.0
    assert all(0.0 <= v[0] <= 1.0 for v in vision["near_zero_share"].values())
    # Smoke has one final seed: every claim is a preview with a finite effect and its checks.
    assert len(payload["claims"]) == 5
    for claim in payload["claims"]:
        assert claim["verdict"] in VERDICTS
        assert claim["preview"] is True and claim["n"] == 1 and claim["interval"] is None
        assert math.isfinite(claim["effect"]) and claim["per_seed"] == [claim["effect"]]
        assert "mirror move / Adam move" in claim["checks"][0]["name"]
    rescored = claims_from_results({"config": payload["config"], "data": data})
    assert [c.to_json() for c in rescored] == payload["claims"]
    titles = [
        "(a) ViT, AC/DC at the selection sparsity, selection seed",
        "(b) LM, one-shot at the largest target, selection seed",
    ]
    assert sorted(payload["tuning"]) == sorted(titles)
    # 3 selection + 6 final classifier units, 2 + 2 language-model units.
    assert len(_unit_files(folder)) == 13


def test_resume_computes_nothing_twice_and_a_changed_config_recomputes(smoke_run, monkeypatch):
    config, folder, first = smoke_run
    before = _unit_files(folder)

    class Trained(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Trained

    monkeypatch.setattr(sparsity_runs, "train_classifier", refuse)
    monkeypatch.setattr(sparsity_runs, "train_language_model", refuse)
    again = run(config, folder, progress=False)  # every unit from the cache: nothing trains
    assert [c.to_json() for c in again.claims] == [c.to_json() for c in first.claims]
    assert json.dumps(json_ready(again.data)) == json.dumps(json_ready(first.data))
    assert again.tuning == first.tuning
    assert _unit_files(folder) == before
    # A field that only chooses how fast units run reuses them; one that changes what a
    # unit computes does not.
    run(dataclasses.replace(config, threads=2), folder, progress=False)
    with pytest.raises(Trained):
        run(dataclasses.replace(config, vit_steps=config.vit_steps + 1), folder, progress=False)


class RefusingTestSplit(Dataset):
    """A test split that fails on any use: selection runs must never read it."""

    def __len__(self) -> int:
        raise AssertionError("a selection run read the test split")

    def __getitem__(self, index):
        raise AssertionError("a selection run read the test split")

    def __getattr__(self, name):
        raise AssertionError(f"a selection run read the test split ({name})")


def test_selection_runs_never_touch_the_test_split(monkeypatch):
    _needs("fashion-mnist")
    _needs("austen")
    config = Config.for_mode("smoke")
    splits, train, validation, _ = sparsity_runs.vision_data(
        config.image_size,
        config.patch,
        config.train_examples,
        config.validation_examples,
        config.test_examples,
    )
    monkeypatch.setattr(
        sparsity_runs, "vision_data", lambda *a: (splits, train, validation, RefusingTestSplit())
    )
    point = {"lr": 2e-3, "alpha": 50.0}
    unit = sparsity_runs.vision_unit(VisionJob(config, "horst", point, 0, 0.9, final=False))
    assert "test_accuracy" not in unit and 0.0 <= unit["validation_accuracy"] <= 1.0
    with pytest.raises(AssertionError, match="read the test split"):
        sparsity_runs.vision_unit(VisionJob(config, "horst", point, 1, 0.9, final=True))
    lm_splits, lm_validation, _ = sparsity_runs.language_data(
        config.lm_seq_len, config.lm_validation_windows, config.lm_test_windows
    )
    monkeypatch.setattr(
        sparsity_runs, "language_data", lambda *a: (lm_splits, lm_validation, RefusingTestSplit())
    )
    lm_unit = sparsity_runs.language_unit(LanguageJob(config, "horst", point, 0, final=False))
    assert lm_unit["split"] == "validation"


def _payload(adamw_dense: float, adamw_90: float) -> dict:
    """A hand-made design-2 payload: 3 seeds, HORST 2 points above AdamW at 90 %."""
    seeds = [1, 2, 3]
    accuracy = {
        "adamw": {"dense": [adamw_dense] * 3, "80%": [0.80, 0.81, 0.79], "90%": [adamw_90] * 3},
        "ham": {"dense": [0.85] * 3, "80%": [0.80] * 3, "90%": [0.76, 0.77, 0.75]},
        "horst": {
            "dense": [0.85] * 3,
            "80%": [0.83, 0.82, 0.84],
            "90%": [adamw_90 + 0.02, adamw_90 + 0.025, adamw_90 + 0.03],
        },
    }
    achieved = {n: {"80%": [0.8] * 3, "90%": [0.9] * 3} for n in accuracy}
    return {
        "config": {
            "optimizers": ["adamw", "ham", "horst"],
            "sparsities": [0.8, 0.9],
            "lm_optimizers": ["adamw", "horst"],
            "lm_sparsities": [0.5, 0.9],
            "seeds": seeds,
        },
        "data": {
            "design": 2,
            "rms_fraction": 0.01,
            "vision": {
                "accuracy": accuracy,
                "achieved": achieved,
                "move_ratio": {"horst": {"dense": [0.5] * 3, "80%": [0.4] * 3, "90%": [0.3] * 3}},
                "near_zero_share": {
                    "adamw": [0.008, 0.009, 0.010],
                    "horst": [0.02, 0.03, 0.025],
                    "ham": [0.01] * 3,
                },
            },
            "language": {
                "perplexity": {
                    "adamw": {"0%": [4.0] * 3, "90%": [10.0, 12.0, 8.0]},
                    "horst": {"0%": [4.1] * 3, "90%": [9.0, 9.0, 9.0]},
                },
                "move_ratio": {"horst": [0.1, 0.1, 0.1]},
            },
        },
    }


def test_design_two_claims_follow_their_formulas():
    claims = claims_from_results(_payload(adamw_dense=0.86, adamw_90=0.78))
    assert len(claims) == 5
    than_adamw, than_ham, half, near_zero, language = claims
    assert than_adamw.per_seed == pytest.approx([0.02, 0.025, 0.03])
    assert than_adamw.interval == pytest.approx(_t_interval([0.02, 0.025, 0.03]))
    assert than_adamw.verdict == "reproduced"  # interval (0.0126, 0.0374) is above 0
    room = than_adamw.checks[2]
    assert room.value == pytest.approx(0.08) and room.passed
    assert than_ham.per_seed == pytest.approx([0.80 - 0.76, 0.805 - 0.77, 0.81 - 0.75])
    # Claim 3: drop_h - 0.5 drop_a, drops averaged over 80 % and 90 %.
    drops_h = [0.85 - (0.83 + 0.80) / 2, 0.85 - (0.82 + 0.805) / 2, 0.85 - (0.84 + 0.81) / 2]
    drops_a = [0.86 - (0.80 + 0.78) / 2, 0.86 - (0.81 + 0.78) / 2, 0.86 - (0.79 + 0.78) / 2]
    assert half.per_seed == pytest.approx(
        [h - 0.5 * a for h, a in zip(drops_h, drops_a, strict=True)]
    )
    assert near_zero.per_seed == pytest.approx([0.012, 0.021, 0.015])
    assert near_zero.verdict == "reproduced"
    # The LM claim is a ratio; its move ratio (0.1) is below 0.2, so it is untested.
    assert language.per_seed == pytest.approx([0.9, 0.75, 1.125])
    assert language.verdict == "untested" and language.checks[0].passed is False


def test_a_baseline_without_room_to_fail_leaves_the_claim_untested():
    claims = claims_from_results(_payload(adamw_dense=0.80, adamw_90=0.78))
    room = claims[0].checks[2]
    assert room.value == pytest.approx(0.02) and room.passed is False
    assert claims[0].verdict == "untested" and claims[2].verdict == "untested"
    assert claims[1].verdict != "untested"  # the HAM comparison does not need AdamW's room


def _committed() -> dict:
    return json.loads((COMMITTED / "results.json").read_text())


def _t_interval(values: list[float]) -> tuple[float, float]:
    count = len(values)
    mean = sum(values) / count
    deviation = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
    half = stats.t.ppf(0.975, count - 1) * deviation / math.sqrt(count)
    return mean - half, mean + half


def test_an_earlier_design_is_refused_with_one_sentence_naming_both_designs():
    first = json.loads((HISTORY / "design1.results.json").read_text())
    assert "design" not in first["data"]
    message = (
        r"^these sparsity results are of design 1 \(no design number\), and this code scores "
        r"design 2 only; earlier designs' full results, with the claims they were scored with, "
        r"are in docs/results/sparsity-full/history/$"
    )
    with pytest.raises(ValueError, match=message):
        claims_from_results(first)
    later = _payload(adamw_dense=0.86, adamw_90=0.78)
    later["data"]["design"] = 3
    with pytest.raises(ValueError, match="of design 3, and this code scores design 2 only"):
        claims_from_results(later)


def test_history_files_hold_the_claims_they_were_scored_with():
    files = sorted(HISTORY.glob("design*.results.json"))
    assert [path.name for path in files] == ["design1.results.json"]
    for path in files:
        payload = json.loads(path.read_text())
        assert payload["name"] == "sparsity" and payload["mode"] == "full"
        assert payload["claims"]
        assert all(claim["verdict"] in VERDICTS for claim in payload["claims"])


def test_committed_full_results_follow_design_two_and_rescore_per_seed():
    payload = _committed()
    data, config = payload["data"], payload["config"]
    assert data["design"] == 2 and len(config["seeds"]) >= 5
    claims = claims_from_results(payload)
    assert [c.to_json() for c in claims] == payload["claims"]
    accuracy = data["vision"]["accuracy"]
    expected = [
        h - a for h, a in zip(accuracy["horst"]["90%"], accuracy["adamw"]["90%"], strict=True)
    ]
    assert claims[0].per_seed == pytest.approx(expected, rel=1e-12)
    assert claims[0].interval == pytest.approx(_t_interval(expected), rel=1e-9)
    for claim in claims:
        assert claim.n == len(config["seeds"]) and not claim.preview
        assert "mirror move / Adam move" in claim.checks[0].name
    # Every grid has the same number of points, and the test split never scored one of them.
    sizes = {name: len(points) for name, points in data["vision"]["selection"].items()}
    assert len(set(sizes.values())) == 1
    assert all(
        "test_accuracy" not in p for points in data["vision"]["selection"].values() for p in points
    )


def test_language_selection_skips_points_whose_dense_model_is_over_ten_percent_worse():
    units = [
        {"perplexity": {"0%": 5.0, "90%": 16.0}},  # the best dense model
        {"perplexity": {"0%": 5.5, "90%": 14.0}},  # exactly 1.1 x: still selectable
        {"perplexity": {"0%": 5.51, "90%": 9.0}},  # just over: excluded
        {"perplexity": {"0%": 11.6, "90%": 11.7}},  # a degenerate model that prunes well
        {"perplexity": {"0%": math.nan, "90%": math.nan}},  # diverged
    ]
    score = pruned_score_of_good_dense(units, "90%")
    scores = [score(unit) for unit in units]
    assert scores[:2] == [16.0, 14.0]
    assert all(math.isnan(value) for value in scores[2:])


def test_a_run_whose_gradient_turns_nan_is_a_diverged_grid_point_not_a_crash():
    from convergent.data import DictDataset
    from convergent.optim import HORST
    from tests.conftest import tiny_regression_transformer

    model = tiny_regression_transformer()
    generator = torch.Generator().manual_seed(0)
    data = DictDataset(
        {"inputs": torch.randn(32, 5, 4, generator=generator), "labels": torch.randn(32, 3)}
    )
    # A finite loss with a NaN gradient: the optimizer's guard refuses the step.
    next(model.parameters()).register_hook(lambda grad: grad * math.nan)
    optimizer = HORST(model.parameters(), lr=1e-3, alpha=10.0)
    recipe = sparsity_runs.Recipe({}, steps=4, batch_size=8)
    assert sparsity_runs._fit(model, optimizer, data, recipe, 0, task="regression") == (
        False,
        None,
    )


def test_move_ratio_recorder_records_every_twentieth_step():
    model = torch.nn.Linear(3, 2)
    optimizer = sparsity_runs.HORST(model.parameters(), lr=0.01)
    recorder = sparsity_runs.MoveRatioRecorder(optimizer, 40 // sparsity_runs.MOVE_RATIO_RECORDS)
    for step in range(1, 41):
        model(torch.randn(4, 3)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        recorder.on_step_end(step, {})
    assert len(recorder.values) == 20
    assert recorder.mean == pytest.approx(sum(recorder.values) / 20)
    assert sparsity_runs.MoveRatioRecorder(optimizer, 0).every == 1


def test_modes_and_bad_values():
    full = Config.for_mode("full")
    assert full.seeds == (1, 2, 3, 4, 5) and full.selection_seed == 0
    assert full.horst_alphas == (3.0, 10.0, 30.0, 100.0)
    assert full.sparsities == (0.7, 0.8, 0.9) and full.selection_sparsity == 0.9
    sizes = {len(list(itertools.product(*axes.values()))) for axes in full.grids().values()}
    assert sizes == {12}
    sizes = {len(list(itertools.product(*a.values()))) for a in full.language_grids().values()}
    assert sizes == {10}
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")
    with pytest.raises(ValueError, match=r"every sparsity must be in \(0, 1\), got 1.2"):
        Config(sparsities=(1.2,))
    with pytest.raises(ValueError, match="optimizers must be among"):
        Config(optimizers=("sgd",))
    with pytest.raises(ValueError, match="selection_seed 1 is also a final seed"):
        Config(selection_seed=1, seeds=(1, 2))
    with pytest.raises(ValueError, match="every classifier grid must have the same number"):
        Config(horst_alphas=(10.0, 20.0, 50.0))
    with pytest.raises(ValueError, match="every language grid must have the same number"):
        Config(lm_horst_alphas=(10.0, 20.0, 50.0))
    # The two experiments select separately: their grids may differ in size.
    assert Config(
        horst_alphas=(1.0, 2.0, 3.0),
        ham_alphas=(1.0, 2.0, 3.0),
        adamw_lrs=(1e-3,),
        adamw_weight_decays=(0.0, 0.1, 0.2),
    ).grids()["horst"]["alpha"] == (1.0, 2.0, 3.0)


def test_prune_a_run_folder_and_save_a_sparse_checkpoint(tmp_path):
    from convergent.commands import TrainConfig, build_model, run_training

    config = TrainConfig(
        data="digits",
        model="transformer",
        steps=3,
        batch_size=16,
        d_model=16,
        n_heads=2,
        n_layers=1,
        d_ff=32,
        eval_every=0,
    )
    run_training(config, tmp_path / "run", progress=False)
    summary = prune_run(tmp_path / "run", (0.5, 0.9), save_to=tmp_path / "pruned")
    assert [row["target"] for row in summary["rows"]] == [0.5, 0.9]
    assert summary["rows"][1]["sparsity"] == pytest.approx(0.9, abs=1e-2)
    assert "accuracy" in summary["dense"]
    assert "head.weight" in summary["excluded"]
    from convergent.data import load_splits

    model = build_model(config, load_splits("digits"))
    state = load_checkpoint(tmp_path / "pruned", model)  # weights_only=True
    saved = Masks.from_state_dict(state["masks"])
    rebuilt = Masks.from_weights(model, list(saved))
    for name, mask in saved.items():
        assert torch.equal(rebuilt[name], mask)
    assert state["pruning"]["target"] == 0.9
    text = format_prune_summary(summary)
    assert "| dense |" in text and "pruned checkpoint:" in text and "head.weight" in text
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\), got 2.0"):
        prune_run(tmp_path / "run", (2.0,))
