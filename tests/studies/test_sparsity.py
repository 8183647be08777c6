"""The sparsity study: smoke run end to end, resume, claims re-scored from the committed full
results, a sweep that never reads the test split, and `convergent prune` on a run folder."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from scipy import stats
from torch.utils.data import Dataset

from convergent.data import is_cached
from convergent.sparse import Masks
from convergent.studies import VERDICTS, rescore, sparsity_runs
from convergent.studies.claims import decide
from convergent.studies.common import json_ready, write_study
from convergent.studies.sparsity import (
    Config,
    claims_from_results,
    run,
    tune_classifier,
    tuning_from_results,
)
from convergent.commands import format_prune_summary, prune_run
from convergent.studies.units import UnitCache
from convergent.train import load_checkpoint
from tests.conftest import assert_drawn_figure

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "sparsity-full"


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
    vision, language = payload["data"]["vision"], payload["data"]["language"]
    assert set(vision["accuracy"]) == {"adamw", "ham", "horst"}
    for by_key in vision["accuracy"].values():
        assert set(by_key) == {"dense", "80%"}
        assert all(0.0 <= value <= 1.0 for values in by_key.values() for value in values)
    for by_key in vision["achieved"].values():
        assert by_key["80%"][0] == pytest.approx(0.8, abs=1e-3)  # exact top-k
    assert set(language["perplexity"]["horst"]) == {"0%", "50%", "90%"}
    assert language["chosen_lr"].keys() == {"adamw", "ham", "horst"}
    # The manipulation checks' quantities are stored, per run and per seed.
    assert set(vision["move_ratio"]) == {"horst"}
    assert 0.0 < vision["move_ratio"]["horst"]["dense"][0] < 1.0
    assert 0.0 < vision["move_ratio"]["horst"]["80%"][0] < 1.0
    assert 0.0 < language["move_ratio"]["horst"][0] < 1.0
    assert all(len(v) == 1 and 0.0 <= v[0] <= 1.0 for v in language["near_zero_fraction"].values())
    # Smoke has one seed: every claim is a preview with a finite effect and its checks.
    assert len(payload["claims"]) == 4
    for claim in payload["claims"]:
        assert claim["verdict"] in VERDICTS
        assert claim["preview"] is True and claim["n"] == 1 and claim["interval"] is None
        assert math.isfinite(claim["effect"]) and claim["per_seed"] == [claim["effect"]]
        assert claim["checks"] and all(c["value"] is not None for c in claim["checks"])
        assert "mirror move / Adam move" in claim["checks"][0]["name"]
    # The claims are exactly what the stored data re-scores to.
    rescored = claims_from_results({"config": payload["config"], "data": payload["data"]})
    assert [c.to_json() for c in rescored] == payload["claims"]
    for title in ("(a) ViT, dense, first seed", "(b) LM, dense, first seed"):
        record = payload["tuning"][title]
        assert set(record) == {"adamw", "ham", "horst"}
        assert all(r["selected"] == {"lr": 3e-3} for r in record.values())
    # 3 sweep (dense) + 3 AC/DC classifier units and 3 language-model units.
    assert len(_unit_files(folder)) == 9


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
    """A test split that fails on any use: the sweep must never read it."""

    def __len__(self) -> int:
        raise AssertionError("the learning-rate sweep read the test split")

    def __getitem__(self, index):
        raise AssertionError("the learning-rate sweep read the test split")

    def __getattr__(self, name):
        raise AssertionError(f"the learning-rate sweep read the test split ({name})")


def test_learning_rate_sweep_never_touches_the_test_split(tmp_path):
    _needs("fashion-mnist")
    from convergent.data import load_splits
    from convergent.studies.sparsity_models import subset

    config = dataclasses.replace(Config.for_mode("smoke"), learning_rates=(1e-3, 3e-3))
    splits = load_splits("fashion-mnist", seed=0, size=config.image_size, patch=config.patch)
    train = subset(splits.train, config.train_examples)
    validation = subset(splits.validation, config.validation_examples)
    guarded = dataclasses.replace(splits, test=RefusingTestSplit())
    cache = UnitCache(tmp_path, "sparsity", json_ready(config), enabled=False)
    tunings = tune_classifier(config, guarded, train, validation, cache, lambda line: None)
    assert set(tunings) == set(config.optimizers)
    for tuning in tunings.values():
        assert [p["lr"] for p in tuning.points] == [1e-3, 3e-3]
        assert all(0.0 <= s <= 1.0 for s in tuning.scores)
        assert "test_accuracy" not in tuning.selected_run


def _committed() -> dict:
    return json.loads((COMMITTED / "results.json").read_text())


def _t_interval(values: list[float]) -> tuple[float, float]:
    count = len(values)
    mean = sum(values) / count
    deviation = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
    half = stats.t.ppf(0.975, count - 1) * deviation / math.sqrt(count)
    return mean - half, mean + half


def test_committed_full_results_rescore_per_seed():
    payload = _committed()
    claims = claims_from_results(payload)
    assert len(claims) == 4
    accuracy = payload["data"]["vision"]["accuracy"]

    def drop(name: str, seed: int) -> float:  # dense minus the mean over 80 % and 90 %
        runs = accuracy[name]
        return runs["dense"][seed] - (runs["80%"][seed] + runs["90%"][seed]) / 2

    seeds = range(len(payload["config"]["seeds"]))
    half_adamw = [drop("horst", s) - 0.5 * drop("adamw", s) for s in seeds]
    than_ham = [drop("horst", s) - drop("ham", s) for s in seeds]
    perplexity = payload["data"]["language"]["perplexity"]
    ratios = [
        perplexity["horst"]["90%"][s] / perplexity["horst"]["0%"][s]
        - perplexity["adamw"]["90%"][s] / perplexity["adamw"]["0%"][s]
        for s in seeds
    ]
    for claim, expected in zip(claims[:3], (half_adamw, than_ham, ratios), strict=True):
        assert claim.n == 3 and not claim.preview
        assert claim.per_seed == pytest.approx(expected, rel=1e-12)
        assert claim.interval == pytest.approx(_t_interval(expected), rel=1e-9)
    assert claims[0].effect == pytest.approx(0.0013667, abs=1e-6)
    near_zero = payload["data"]["near_zero_fraction"]
    assert claims[3].per_seed == pytest.approx([near_zero["horst"] - near_zero["adamw"]])
    assert claims[3].n == 1 and claims[3].preview and "only the first seed" in claims[3].evidence
    # The move ratio was never stored: every verdict is untested, whatever the effect says.
    for claim in claims:
        assert claim.verdict == "untested"
        move = claim.checks[0]
        assert move.value is None and move.passed is None
        assert "not stored by this run" in move.note and "0.016" in move.note
    # Without the checks: HAM's claim holds on all 3 seeds, the others straddle 0.
    verdicts = [decide(c.effect, c.interval, c.threshold, []) for c in claims]
    assert verdicts == ["inconclusive", "reproduced", "inconclusive", "reproduced"]
    # AC/DC did reach its targets in those runs.
    assert claims[0].checks[1].passed is True and claims[1].checks[1].passed is True


def test_committed_full_results_tuning_and_rescore(tmp_path):
    payload = _committed()
    records = tuning_from_results(payload)
    vision = records["(a) ViT, dense, first seed"]
    language = records["(b) LM, dense, first seed"]
    assert {k: v["selected"]["lr"] for k, v in vision.items()} == payload["data"]["vision"][
        "chosen_lr"
    ]
    assert vision["horst"]["points"][1] == {"lr": 0.002, "validation": 0.8388}
    assert vision["ham"]["on_edge"] == ["lr"] and vision["adamw"]["on_edge"] == ["lr"]
    assert language["horst"]["criterion"] == "validation perplexity (lower is better)"
    assert all(r["selected"] == {"lr": 0.004} and r["on_edge"] == ["lr"] for r in language.values())
    folder = tmp_path / "sparsity-full"
    shutil.copytree(COMMITTED, folder)
    result = rescore(folder)
    written = json.loads((folder / "results.json").read_text())
    assert [c["verdict"] for c in written["claims"]] == ["untested"] * 4
    assert written["tuning"] == json.loads(json.dumps(records))
    assert written["data"] == payload["data"]
    assert "Selected on the edge of its grid" in (folder / "report.md").read_text()
    assert len(result.claims) == 4


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
    assert Config.for_mode("full").seeds == (0, 1, 2, 3, 4)
    assert Config.for_mode("full").learning_rates == (1e-3, 2e-3, 4e-3)
    assert Config.for_mode("quick").sparsities == (0.7, 0.8, 0.9)
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")
    with pytest.raises(ValueError, match=r"every sparsity must be in \(0, 1\), got 1.2"):
        Config(sparsities=(1.2,))
    with pytest.raises(ValueError, match="optimizers must be among"):
        Config(optimizers=("sgd",))


def test_prune_a_run_folder_and_save_a_sparse_checkpoint(tmp_path):
    from convergent.commands import TrainConfig, build_model, run_training

    config = TrainConfig(data="digits", model="transformer", steps=3, batch_size=16,
                         d_model=16, n_heads=2, n_layers=1, d_ff=32, eval_every=0)  # fmt: skip
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
