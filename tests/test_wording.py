"""Messages in the user's own words: Python keywords from Python, flags from the command line,
and "did you mean" for a misspelled choice."""

from __future__ import annotations

import json

import pytest
from torch import nn

from convergent.cli import main
from convergent.wording import command_line, did_you_mean, has_option, option


def test_an_option_is_a_keyword_in_python_and_a_flag_under_the_command_line():
    assert option("include_embeddings", True) == "include_embeddings=True"
    assert option("pattern", "2:4") == "pattern='2:4'" and option("lr") == "lr"
    with command_line({"include_first", "pattern", "save_to"}, {"save_to": "--save"}):
        assert option("include_embeddings", True) == "--include-embeddings"
        assert option("include_first", False) == "--no-include-first"
        assert option("pattern", "2:4") == "--pattern 2:4"
        assert option("save_to") == "--save"
        assert has_option("pattern") and not has_option("overwrite")
    assert has_option("overwrite")  # Python takes every keyword


def test_did_you_mean_names_the_closest_choices_only():
    assert did_you_mean("wand", ("magnitude", "wanda", "sparsegpt")) == "; did you mean 'wanda'?"
    assert did_you_mean("zzz", ("magnitude", "wanda")) == ""


def _error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_misspelled_choices_get_a_suggestion(tmp_path, capsys):
    out = ["--out", str(tmp_path / "run")]
    assert "did you mean 'fashion-mnist'?" in _error(
        ["train", "--data", "fashion-mnst", *out], capsys
    )
    err = _error(["train", "--data", "digits", "--model", "minlm", *out], capsys)
    assert "--model must be one of transformer, minilm, got 'minlm'; did you mean 'minilm'?" in err
    assert "did you mean 'residual'?" in _error(["reproduce", "residal"], capsys)
    with pytest.raises(SystemExit):  # argparse's own choices: one line, then exit 2
        main(["prune", str(tmp_path), "--method", "wand"])
    assert "invalid choice: 'wand'" in capsys.readouterr().err


def test_the_command_line_names_its_flags_in_errors_and_reasons(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--data", "digits", "--model", "transformer", "--steps", "2"]
    err = _error([*argv, "--d-model", "16", "--pattern", "2:4", "--sparsity", "0.9", "--out",
                  str(run)], capsys)  # fmt: skip
    assert "--pattern 2:4 prunes 1 - N/M = 0.5 of the weights, so --sparsity must be 0.5" in err
    assert main([*argv, "--d-model", "16", "--no-progress", "--out", str(run)]) == 0
    pruned = tmp_path / "pruned"
    assert main(["prune", str(run), "--sparsity", "0.5", "--save", str(pruned), "--no-bench"]) == 0
    excluded = json.loads((pruned / "pruning.json").read_text())["excluded"]
    assert excluded["head.weight"] == "last layer; pass --include-last to prune it"


def test_python_callers_get_keywords_in_the_same_reasons():
    from convergent.sparse import MaskSpec

    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    reasons = MaskSpec(include_first=False).select(model).excluded
    assert reasons["0.weight"] == "embedding; pass include_embeddings=True to prune it"
    assert reasons["1.weight"] == "first layer; pass include_first=True to prune it"
    assert reasons["3.weight"] == "last layer; pass include_last=True to prune it"
