"""``convergent reproduce --pilot`` and the command table: the studies with a pilot are read
from the studies' registry, and a pilot runs through the command layer like a study."""

from __future__ import annotations

import json

import pytest

from convergent.cli import build_parser, main


@pytest.fixture
def piloted_toy(monkeypatch):
    """The toy study, registered, with a regime pilot that logs two lines and records its
    calls."""
    from convergent import studies
    from tests.studies import toy_study

    calls = []

    def run_pilot(folder, log):
        calls.append(folder)
        log("pilot: seed 30")
        log("pilot: seed 31")
        return {"chosen": {"depth": 8}, "used": 8, "rises": (0.61, 0.19)}

    monkeypatch.setitem(studies.STUDIES, "toy", "tests.studies.toy_study")
    monkeypatch.setattr(toy_study.STUDY, "run_pilot", run_pilot, raising=False)
    return calls


def test_a_pilot_runs_through_the_command_and_writes_pilot_json(piloted_toy, tmp_path, capsys):
    assert main(["reproduce", "toy", "--pilot", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "toy-pilot"
    assert piloted_toy == [folder]
    out = capsys.readouterr().out
    assert out == (
        "pilot: seed 30\npilot: seed 31\n"
        f"toy pilot: {folder / 'pilot.json'} (chosen: {{'depth': 8}}, used: 8)\n"
    )
    written = json.loads((folder / "pilot.json").read_text())
    assert written == {"chosen": {"depth": 8}, "used": 8, "rises": [0.61, 0.19]}
    # --no-progress keeps the pilot's log to itself, not its result
    assert main(["reproduce", "toy", "--pilot", "--no-progress", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"toy pilot: {folder / 'pilot.json'} (chosen: {{'depth': 8}}, used: 8)"
    ]


@pytest.mark.parametrize("names", [["residual"], ["toy", "descent"], ["all"]])
def test_a_pilot_of_a_study_without_one_or_of_several_is_refused(
    piloted_toy, names, tmp_path, capsys
):
    assert main(["reproduce", *names, "--pilot", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    expected = "--pilot runs one study that has a pilot (descent or sparsity or toy), got "
    assert expected in err and err.count("\n") == 1
    assert piloted_toy == []


def test_the_pilot_help_lists_the_registry_s_piloted_studies(piloted_toy):
    parser = build_parser()
    commands = next(a for a in parser._actions if a.choices and "reproduce" in a.choices)
    help_text = " ".join(commands.choices["reproduce"].format_help().split())
    assert "on the validation split instead (descent, sparsity, toy), writing" in help_text
