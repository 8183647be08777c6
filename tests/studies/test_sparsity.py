"""The sparsity study end to end at smoke size, and `convergent prune` on a run folder."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from convergent.data import is_cached
from convergent.sparse import Masks
from convergent.studies.common import write_study
from convergent.studies.sparsity import Config, run
from convergent.studies.sparsity_prune import format_prune_summary, prune_run
from convergent.train import load_checkpoint


def _needs(name: str) -> None:
    if shutil.which("apt-get") is None and not is_cached(name):
        pytest.skip(f"{name} needs apt-get (a Debian or Ubuntu machine) or a cached copy")


def test_smoke_study_runs_end_to_end(tmp_path):
    _needs("fashion-mnist")
    _needs("austen")
    config = Config.for_mode("smoke")
    result = run(config, tmp_path, progress=False)
    report = write_study(result, tmp_path)
    assert report.is_file() and (tmp_path / "results.json").is_file()
    for figure in result.figures:
        assert (tmp_path / figure).stat().st_size > 0
    payload = json.loads((tmp_path / "results.json").read_text())
    accuracy = payload["data"]["vision"]["accuracy"]
    assert set(accuracy) == {"adamw", "ham", "horst"}
    for by_key in accuracy.values():
        assert set(by_key) == {"dense", "80%"}
        assert all(0.0 <= value <= 1.0 for values in by_key.values() for value in values)
    for by_key in payload["data"]["vision"]["achieved"].values():
        assert by_key["80%"][0] == pytest.approx(0.8, abs=1e-3)  # exact top-k
    perplexity = payload["data"]["language"]["perplexity"]
    assert set(perplexity["horst"]) == {"0%", "50%", "90%"}
    assert all(
        claim["verdict"] == "undecided" for claim in payload["claims"]
    )  # smoke decides nothing
    assert payload["data"]["language"]["chosen_lr"].keys() == {"adamw", "ham", "horst"}


def test_modes_and_bad_values():
    assert len(Config.for_mode("full").seeds) >= 3
    assert Config.for_mode("quick").sparsities == (0.7, 0.8, 0.9)
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")
    with pytest.raises(ValueError, match=r"every sparsity must be in \(0, 1\), got 1.2"):
        Config(sparsities=(1.2,))
    with pytest.raises(ValueError, match="optimizers must be among"):
        Config(optimizers=("sgd",))


def test_prune_a_run_folder_and_save_a_sparse_checkpoint(tmp_path):
    from convergent.train.recipe import TrainConfig, build_model, run_training

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
    with pytest.raises(ValueError, match="every sparsity must be in"):
        prune_run(tmp_path / "run", (2.0,))
