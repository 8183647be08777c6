"""``prune --statistics``: the dtype reaches the pruner (and the report), and a bad one is
refused by the parser before any model is loaded."""

from __future__ import annotations

import json

import pytest

from convergent.cli import main
from convergent.commands import prune_hf_folder
from tests.commands.conftest import EXAMPLES, MAX_LENGTH

DATA = ["--data", "rt-sentences", "--examples", str(EXAMPLES), "--max-length", str(MAX_LENGTH),
        "--calibration-examples", "8"]  # fmt: skip


def test_the_statistics_dtype_reaches_the_pruner_and_the_report(gpt2_folder, tmp_path):
    out = tmp_path / "pruned"
    assert main(["prune", str(gpt2_folder), "--method", "sparsegpt", "--sparsity", "0.5",
                 "--statistics", "float64", "--save", str(out), "--no-bench", *DATA]) == 0  # fmt: skip
    assert json.loads((out / "pruning.json").read_text())["options"]["statistics"] == "float64"


def test_the_command_defaults_to_float32_and_the_library_to_float64(gpt2_folder, tmp_path):
    # the command line's default is float32 (as llm-compressor and the SparseGPT authors'
    # code); the library's (the request's) stays float64, which the studies' committed units
    # were computed with
    out = tmp_path / "pruned"
    assert main(["prune", str(gpt2_folder), "--method", "wanda", "--sparsity", "0.5",
                 "--save", str(out), "--no-bench", *DATA]) == 0  # fmt: skip
    assert json.loads((out / "pruning.json").read_text())["options"]["statistics"] == "float32"
    summary = prune_hf_folder(gpt2_folder, (0.5,), method="wanda", data="rt-sentences",
                              examples=EXAMPLES, max_length=MAX_LENGTH, calibration_examples=8)  # fmt: skip
    assert summary["options"]["statistics"] == "float64"


def test_a_bad_statistics_dtype_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["prune", "any/folder", "--statistics", "float16"])
    assert "argument --statistics: invalid choice: 'float16'" in capsys.readouterr().err
