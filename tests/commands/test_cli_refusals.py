"""Every refusal of ``prune``, ``bench``, ``train`` and ``diagnose`` on the command line is one
sentence that names the command's flags, never the Python names behind them; a misspelt flag
gets the command's own usage and the flag it is closest to, before any heavy import."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from convergent.cli import build_parser, main


def _flags_and_names(command: str) -> tuple[set[str], set[str]]:
    """The command's flags, and the keyword names behind them that have an underscore."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    actions = commands.choices[command]._actions
    flags = {flag for action in actions for flag in action.option_strings}
    names = {action.dest for action in actions if "_" in action.dest} | {"save_to", "run_dir"}
    return flags, names


def _refusals(folder, pruned, tmp_path):
    data = ["--data", "rt-sentences", "--examples", "4", "--max-length", "16"]
    nonempty = tmp_path / "full"
    nonempty.mkdir()
    (nonempty / "file").write_text("x")
    return {
        "prune": [
            [folder, "--sparsity", "1.5", *data],
            [folder, "--pattern", "2:4", "--sparsity", "0.9", *data],
            [folder, "--pattern", "3:2", *data],
            [folder, "--method", "wanda", "--distribution", "global", *data],
            [folder, "--distribution", "owl", "--pattern", "2:4", *data],
            [folder, "--owl-m", "0", *data],
            [folder, "--owl-lmbda", "0.7", *data],
            [folder, "--method", "wanda", "--calibration-examples", "0", *data],
            [folder, "--method", "wanda", "--calibration-batch-size", "0", *data],
            [folder, "--low-memory", *data],
            [
                folder,
                "--low-memory",
                "--sparsity",
                "0.5",
                "--sparsity",
                "0.7",
                "--save",
                str(tmp_path / "x"),
                *data,
            ],
            [folder, "--dense", *data],
            [pruned, "--low-memory", "--sparsity", "0.5", "--save", str(tmp_path / "y"), *data],
            [folder, "--save", str(nonempty), *data],
            [folder, "--device", "gpu", *data],
            [folder, "--examples", "0", "--data", "rt-sentences"],
            [folder, "--max-length", "1", "--data", "rt-sentences"],
            [folder, "--data", "digits", "--max-length", "16"],
        ],
        "bench": [
            [pruned, "--threads", "0", "--no-memory"],
            [pruned, "--lengths", "0", "--no-memory"],
            [pruned, "--lengths", "999", "--no-memory"],
        ],
        "train": [
            ["--data", "digits", "--steps", "-3"],
            ["--data", "digits", "--lr", "0"],
            ["--data", "digits", "--model", "minilm"],
            ["--data", "digits", "--sparsity", "0.8", "--pattern", "2:4"],
            ["--data", "digits", "--sparsity", "1.5"],
        ],
        "diagnose": [
            ["minilm"],
            [folder, "--examples", "0", "--out", str(tmp_path / "d")],
            [folder, "--max-length", "1", "--out", str(tmp_path / "d")],
        ],
    }


@pytest.fixture(scope="module")
def pruned_folder(gpt2_folder, tmp_path_factory):
    from convergent.commands import prune_hf_folder

    out = tmp_path_factory.mktemp("pruned") / "model"
    prune_hf_folder(gpt2_folder, (0.5,), data="rt-sentences", examples=4, max_length=16,
                    save_to=out)  # fmt: skip
    return out


@pytest.mark.parametrize("command", ["prune", "bench", "train", "diagnose"])
def test_every_refusal_names_the_commands_flags(command, gpt2_folder, pruned_folder, tmp_path,
                                                capsys):  # fmt: skip
    flags, names = _flags_and_names(command)
    for argv in _refusals(str(gpt2_folder), str(pruned_folder), tmp_path)[command]:
        extra = ["--out", str(tmp_path / "run")] if command == "train" else []
        assert main([command, *argv, *extra]) == 2, argv
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "Traceback" not in error, error
        named = set(re.findall(r"--[a-z][a-z-]*", error))
        assert named and named <= flags | {f"--no-{f[2:]}" for f in flags}, (argv, error)
        python = {name for name in names if re.search(rf"\b{name}\b", error)}
        assert not python, (argv, error)


def test_a_misspelt_flag_gets_the_commands_usage_and_the_closest_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["prune", "some/folder", "--sparsty", "0.5"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: convergent prune ")
    assert "unrecognized arguments: --sparsty 0.5; did you mean '--sparsity'?" in error


def test_flags_are_checked_before_the_heavy_imports():
    # a fresh interpreter: a bad flag is refused without importing torch
    code = (
        "import sys\n"
        "from convergent.cli import main\n"
        "try:\n"
        "    main(['prune', 'x', '--sparsty', '0.5'])\n"
        "except SystemExit as exit_:\n"
        "    print(exit_.code, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert done.stdout.split() == ["2", "False", "False"]
