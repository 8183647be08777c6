"""What ``convergent prune`` prints and writes: honest rows, shares of zeros, weights left dense,
N:M's one target, OWL, and one-sentence errors for a device or dtype this machine lacks."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from convergent.cli import main
from convergent.commands import load_sparse, prune_hf_folder
from convergent.models.placement import check_device, check_dtype_on
from convergent.sparse import MaskSpec
from tests.commands.conftest import EXAMPLES, MAX_LENGTH

DATA = ["--data", "rt-sentences", "--examples", str(EXAMPLES), "--max-length", str(MAX_LENGTH)]


def test_an_n_m_pattern_prunes_one_target_and_refuses_a_conflicting_one(gpt2_folder, capsys):
    summary = prune_hf_folder(gpt2_folder, None, data="rt-sentences", examples=EXAMPLES,
                              max_length=MAX_LENGTH, spec=MaskSpec(pattern="2:4"))  # fmt: skip
    assert [row["target"] for row in summary["rows"]] == [0.5]
    code = main(["prune", str(gpt2_folder), "--pattern", "2:4", "--sparsity", "0.9", *DATA])
    assert code != 0
    error = capsys.readouterr().err
    assert "--pattern 2:4 prunes 1 - N/M = 0.5 of every layer, so --sparsity must be 0.5" in error
    assert "got 0.9" in error and error.count("\n") == 1


def test_the_table_gives_the_whole_models_zeros_and_what_stayed_dense(gpt2_folder, tmp_path,
                                                                      capsys):  # fmt: skip
    out = tmp_path / "pruned"
    code = main(["prune", str(gpt2_folder), "--sparsity", "0.7", "--save", str(out), "--no-bench",
                 *DATA])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "pruning.json").read_text())
    (row,) = summary["rows"]
    total = sum(layer["shape"][0] * layer["shape"][1] for layer in summary["layers"])
    zeros = sum(layer["sparsity"] * layer["shape"][0] * layer["shape"][1]
                for layer in summary["layers"])  # fmt: skip
    model = load_sparse(out)
    everything = sum(p.numel() for p in model.parameters())
    # The pruned layers lose 70 %; the tied embedding stays dense, so the model loses far less.
    assert row["sparsity"] == pytest.approx(zeros / total, rel=1e-6)
    assert row["model_sparsity"] == pytest.approx(zeros / everything, rel=1e-6)
    assert row["model_sparsity"] < 0.5 * row["sparsity"]
    markdown = (out / "pruning.md").read_text()
    assert "whole model's zeros" in markdown and "## Weights left dense" in markdown
    assert "transformer.wte.weight" in markdown and "tied input/output embedding" in markdown
    assert "None" not in markdown and "| |" not in markdown.replace("|---|", "")
    assert "left dense: transformer.wte.weight" in printed
    assert "whole model's zeros" in printed


def test_owl_from_the_command_line(gpt2_folder, tmp_path, capsys):
    out = tmp_path / "owl"
    code = main(["prune", str(gpt2_folder), "--method", "wanda", "--distribution", "owl",
                 "--owl-m", "3", "--owl-lmbda", "0.05", "--sparsity", "0.6",
                 "--calibration-examples", "8", "--save", str(out), "--no-bench", *DATA])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "pruning.json").read_text())
    values = list(summary["block_sparsities"].values())
    assert len(values) == 2 and max(values) - min(values) == pytest.approx(0.1)
    assert summary["spec"]["owl_m"] == 3.0 and summary["spec"]["owl_lmbda"] == 0.05
    assert "OWL block sparsities" in capsys.readouterr().out


def test_train_has_no_owl(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--data", "digits", "--distribution", "owl"])
    assert "invalid choice: 'owl'" in capsys.readouterr().err


def test_each_block_is_logged_with_its_seconds(gpt2_folder, caplog):
    with caplog.at_level(logging.INFO, logger="convergent.sparse.blockwise"):
        prune_hf_folder(gpt2_folder, (0.5,), data="rt-sentences", examples=EXAMPLES,
                        max_length=MAX_LENGTH, method="sparsegpt", calibration_examples=8)  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("block ")]
    assert [line.split(":")[0] for line in lines] == ["block 1/2", "block 2/2"]
    assert all(line.endswith(" s") and "4 layers pruned" in line for line in lines)


def test_a_device_or_dtype_this_machine_lacks_is_one_sentence(gpt2_folder, capsys):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device='cuda' was asked for, but this machine"):
            check_device("cuda")
        code = main(["prune", str(gpt2_folder), "--device", "cuda", *DATA])
        assert code != 0 and "this machine has no CUDA" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"device must be cpu, cuda or cuda:N, got 'gpu'"):
        check_device("gpu")
    with pytest.raises(ValueError, match=r"dtype='bool' cannot be computed on cpu \("):
        check_dtype_on(torch.device("cpu"), torch.bool)
    assert check_device("cpu", torch.bfloat16) == torch.device("cpu")


def test_low_memory_is_for_hugging_face_folders(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", "digits", "--model", "transformer", "--steps", "4",
                 "--out", str(run), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    for flag in ("--low-memory", "--no-low-memory"):
        code = main(["prune", str(run), flag, "--save", str(tmp_path / "x")])
        assert code != 0
        assert "--low-memory applies only to Hugging Face model folders" in capsys.readouterr().err
    # from Python, the same refusal in Python's words
    from convergent.commands import prune_run

    with pytest.raises(ValueError, match=r"^data, seed apply only to Hugging Face model folders"):
        prune_run(run, (0.5,), data="austen", seed=3)
