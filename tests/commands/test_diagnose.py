from __future__ import annotations

import json

import pytest

from convergent.commands import diagnose
from convergent.train import CheckpointError
from tests.conftest import assert_drawn_figure

FIGURES = ("layerwise_loss.png", "spectra.png", "rank_collapse.png", "weights.png",
           "query_key_norms.png")  # fmt: skip


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    from convergent.commands import TrainConfig, run_training

    folder = tmp_path_factory.mktemp("run")
    config = TrainConfig(
        data="digits", model="transformer", steps=4, batch_size=16, d_model=16, n_layers=2,
        n_heads=2, d_ff=32, eval_every=0, device="cpu",
    )  # fmt: skip
    run_training(config, folder, progress=False)
    return folder


def test_diagnose_writes_the_report_folder(digits_run, tmp_path):
    summary = diagnose(digits_run, "digits", tmp_path / "report", examples=20)
    assert summary.read_text().startswith("# Diagnostics:")
    for name in FIGURES:
        assert_drawn_figure(tmp_path / "report" / name)
    payload = json.loads((tmp_path / "report" / "diagnostics.json").read_text())
    assert len(payload["layerwise_losses"]) == 3
    assert [row["layer"] for row in payload["spectra"]] == [
        "blocks.0.attention",
        "blocks.1.attention",
    ]
    assert len(payload["rank_collapse"]) == 3
    assert payload["examples"] == 20
    # A checkpoint folder deep inside the run works too.
    again = diagnose(digits_run / "checkpoints", "digits", tmp_path / "again", examples=8)
    assert again.is_file()


def test_diagnose_without_data_uses_the_runs_own(digits_run, tmp_path, capsys):
    from convergent.cli import main

    assert main(["diagnose", str(digits_run), "--examples", "8", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "diagnostics.json").read_text())
    assert payload["data"] == "digits" and payload["notes"] == []
    capsys.readouterr()
    assert main(["diagnose", "minilm", "--out", str(tmp_path / "m")]) == 2
    assert "diagnosing pretrained MiniLM needs --data" in capsys.readouterr().err


def test_missing_or_foreign_checkpoints_give_a_clear_error(digits_run, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        diagnose(tmp_path / "nowhere", "digits", tmp_path / "out")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "weights.bin").write_bytes(b"not ours")
    with pytest.raises(CheckpointError, match="is not a convergent checkpoint"):
        diagnose(tmp_path / "foreign", "digits", tmp_path / "out")
    # Our checkpoint, but a config that describes another model: the weights do not fit.
    import shutil

    other = tmp_path / "other"
    shutil.copytree(digits_run, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "d_model": 32, "d_ff": 64}))
    with pytest.raises(CheckpointError, match="does not fit the model"):
        diagnose(other, "digits", tmp_path / "out")
    (other / "config.json").write_text(json.dumps({"learning_rate": 1}))
    with pytest.raises(CheckpointError, match="not a convergent train config"):
        diagnose(other, "digits", tmp_path / "out")
    (other / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        diagnose(other, "digits", tmp_path / "out")


def test_diagnose_minilm(tmp_path):
    summary = diagnose(
        "minilm", "rt-sentences", tmp_path, examples=8, max_length=24, head_examples=16
    )
    payload = json.loads((tmp_path / "diagnostics.json").read_text())
    assert len(payload["spectra"]) == 6
    assert len(payload["layerwise_losses"]) == 7
    assert "fitted by L-BFGS" in summary.read_text()
    with pytest.raises(ValueError, match="not text"):
        diagnose("minilm", "digits", tmp_path / "x")
