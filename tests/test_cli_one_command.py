"""A command line builds the parser of its own command alone: the same parse, fewer imports."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import convergent
from convergent.cli import COMMAND_MODULES, build_parser

SRC = Path(convergent.__file__).resolve().parents[1]  # the child imports this package
LINES = {
    "train": ["train", "--data", "digits", "--steps", "3", "--out", "runs/a"],
    "data": ["data", "list"],
    "prune": ["prune", "runs/a", "--sparsity", "0.5", "--sparsity", "0.9"],
    "bench": ["bench", "runs/a", "--threads", "1"],
    "diagnose": ["diagnose", "runs/a"],
    "reproduce": ["reproduce", "residual", "--smoke", "--seeds", "2"],
    "report": ["report", "docs/results"],
}


def test_every_command_has_a_line_here():
    assert set(LINES) == set(COMMAND_MODULES)


@pytest.mark.parametrize("command", list(LINES))
def test_a_commands_own_parser_parses_its_line_as_the_whole_parser_does(command):
    alone = build_parser(command)
    (commands,) = [a for a in alone._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == {command}
    assert vars(alone.parse_args(LINES[command])) == vars(build_parser().parse_args(LINES[command]))


def test_a_data_list_process_imports_no_other_commands_module():
    code = (
        "import sys; from convergent.cli import main; status = main(['data', 'list']); "
        "print(status, *sorted(m for m in sys.modules if m.startswith('convergent.commands.')"
        " or m == 'convergent.studies'))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    status, *imported = child.stdout.split("\n")[-2].split()
    assert status == "0"
    others = set(COMMAND_MODULES.values()) - {COMMAND_MODULES["data"]}
    assert not others & set(imported), imported
    assert "convergent.studies" not in imported
