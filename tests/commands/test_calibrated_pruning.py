"""``prune --method wanda|sparsegpt`` on a Hugging Face folder and on a run folder (tiny, offline)."""

from __future__ import annotations

import json

import pytest
import torch

import convergent.commands.prune as prune_module
from convergent.cli import main
from convergent.commands import load_sparse, prune_hf_folder
from convergent.commands.hf_folders import evaluation_data, load_hf_folder
from tests.commands.conftest import EXAMPLES, MAX_LENGTH
from tests.commands.test_hf_folders import _perplexity


def test_sparsegpt_save_reloads_to_the_same_perplexity(gpt2_folder, validation, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "gpt2-sparsegpt"
    summary = prune_hf_folder(
        gpt2_folder, (0.5,), data="rt-sentences", examples=EXAMPLES, max_length=MAX_LENGTH,
        method="sparsegpt", calibration_examples=8, save_to=out,
    )  # fmt: skip
    reloaded = load_sparse(out)
    after = _perplexity(reloaded, validation)  # counted in the test, on the reloaded folder
    assert summary["rows"][0]["perplexity"] == pytest.approx(after, rel=1e-5)
    dense = AutoModelForCausalLM.from_pretrained(gpt2_folder, local_files_only=True)
    assert _perplexity(dense, validation) != pytest.approx(after, rel=1e-6)
    payload = json.loads((out / "pruning.json").read_text())
    assert payload["method"] == "sparsegpt"
    assert payload["calibration"] == {
        "data": "train split of rt-sentences", "examples": 8, "method": "sparsegpt",
    }  # fmt: skip
    for row in payload["layers"]:
        weight = reloaded.get_parameter(row["name"])
        assert row["method"] == "sparsegpt"
        assert float((weight == 0).float().mean()) == pytest.approx(row["sparsity"])
        assert row["sparsity"] == pytest.approx(0.5, abs=0.02)
    assert "# One-shot sparsegpt pruning" in (out / "pruning.md").read_text()


def test_calibration_never_reads_the_scored_windows(gpt2_folder, monkeypatch):
    seen = []
    original = prune_module.calibration_batches

    def recording(dataset, *args, **kwargs):
        seen.append(dataset.tensors["input_ids"].clone())
        return original(dataset, *args, **kwargs)

    monkeypatch.setattr(prune_module, "calibration_batches", recording)
    prune_hf_folder(
        gpt2_folder, (0.5,), data="rt-sentences", examples=EXAMPLES, max_length=MAX_LENGTH,
        method="wanda", calibration_examples=16,
    )  # fmt: skip
    loaded = load_hf_folder(gpt2_folder)
    scored = evaluation_data(loaded, "rt-sentences", max_length=MAX_LENGTH).dataset
    scored_rows = {tuple(row) for row in scored.tensors["input_ids"].tolist()}
    (calibration,) = seen
    assert len(calibration) == 16
    assert not any(tuple(row) in scored_rows for row in calibration.tolist())


def test_the_command_prunes_two_four_with_wanda(gpt2_folder, tmp_path, capsys):
    out = tmp_path / "gpt2-wanda"
    code = main([
        "prune", str(gpt2_folder), "--method", "wanda", "--pattern", "2:4",
        "--data", "rt-sentences", "--examples", "4", "--max-length", str(MAX_LENGTH),
        "--calibration-examples", "8", "--sparsity", "0.5", "--save", str(out), "--no-bench",
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "| dense |" in printed and "pruned model and report" in printed
    pruned = load_sparse(out)
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.weight"):
        weight = pruned.get_parameter(name)  # Conv1D: [in, out], groups run along dim 0
        groups = (weight.T.reshape(weight.shape[1], -1, 4) != 0).sum(dim=-1)
        assert int(groups.max()) <= 2, name


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--method", "obs"], "invalid choice: 'obs'"),
        (["--method", "wanda", "--distribution", "global"], "--distribution global is for"),
        (
            ["--method", "wanda", "--calibration-examples", "0"],
            "--calibration-examples 0 is out of range",
        ),
    ],
)
def test_bad_calibration_options_are_one_sentence(gpt2_folder, flags, message, capsys):
    with pytest.raises(SystemExit) if "invalid choice" in message else _no_raise():
        code = main(["prune", str(gpt2_folder), "--examples", "4", "--max-length", "16", *flags])
        assert code != 0
    assert message in capsys.readouterr().err


class _no_raise:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> bool:
        return False


def test_a_run_folder_calibrates_on_its_training_split(tmp_path):
    from convergent.commands.prune import prune_run

    run = tmp_path / "run"
    assert main([
        "train", "--data", "digits", "--model", "transformer", "--steps", "20",
        "--out", str(run), "--no-progress",
    ]) == 0  # fmt: skip
    summary = prune_run(run, (0.5,), method="sparsegpt", calibration_examples=32,
                        save_to=tmp_path / "pruned")  # fmt: skip
    assert summary["calibration"]["data"] == "train split of the run's data"
    assert summary["calibration"]["examples"] == 32
    assert all(row["method"] == "sparsegpt" for row in summary["layers"])
    assert (tmp_path / "pruned" / "pruning.md").is_file()
    state = torch.load(next((tmp_path / "pruned" / "checkpoints").glob("*/state.pt")),
                       weights_only=True)  # fmt: skip
    assert state["pruning"]["method"] == "sparsegpt"


@pytest.mark.parametrize("low_memory", [False, True])
def test_the_calibration_batch_size_reaches_both_paths(gpt2_folder, monkeypatch, tmp_path,
                                                       low_memory):  # fmt: skip
    import convergent.commands.prune_streamed as streamed_module

    sizes: list[list[int]] = []
    original = prune_module.calibration_batches

    def recording(*args, **kwargs):
        batches = original(*args, **kwargs)
        sizes.append([len(batch["input_ids"]) for batch in batches])
        return batches

    monkeypatch.setattr(prune_module, "calibration_batches", recording)
    monkeypatch.setattr(streamed_module, "calibration_batches", recording)
    prune_hf_folder(
        gpt2_folder, (0.5,), data="rt-sentences", examples=EXAMPLES, max_length=MAX_LENGTH,
        method="wanda", calibration_examples=8, calibration_batch_size=3,
        low_memory=low_memory, save_to=tmp_path / "out",
    )  # fmt: skip
    assert sizes == [[3, 3, 2]]  # 8 examples, 3 at a time
