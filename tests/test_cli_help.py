"""``--help`` comes from the recorded parser (no torch), says the same as the real one, and
every entry says what its option does."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from convergent.cli import add_commands, build_parser, new_parser
from convergent.cli_help import RECORD, asks_for_help, record, replay


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list:
    """Every (sub)command of ``parser`` as the words that reach it, the top first."""
    paths = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*path, name))
    return paths


PATHS = _command_paths(build_parser())


def test_the_record_is_what_the_code_builds():
    stored = json.loads(RECORD.read_text())["calls"]
    built = json.loads(json.dumps(record(new_parser, add_commands)))
    assert built == stored, (
        "src/convergent/cli_help.json is out of date; rewrite it with: "
        "python tools/record_cli_help.py"
    )


def _help(parser: argparse.ArgumentParser, path: tuple[str, ...], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([*path, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "convergent")
def test_the_replayed_parser_prints_the_real_help(path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    replayed = replay(new_parser, json.loads(RECORD.read_text())["calls"])
    assert _help(replayed, path, capsys) == _help(build_parser(), path, capsys)


def test_help_imports_no_heavy_module():
    # Not a timing: what makes --help slow is importing torch (seconds); the record needs none.
    script = (
        "import sys\n"
        "from convergent.cli import main\n"
        "for argv in (['--help'], ['train', '--help'], ['prune', '--help'], ['--version'], []):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exited:\n"
        "        assert exited.code == (0 if argv else 2), argv\n"
        "print(sorted(name for name in ('torch', 'transformers', 'numpy') if name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_help_is_asked_for_before_a_double_dash_only():
    assert asks_for_help(["train", "--help"]) and asks_for_help(["-h"])
    assert asks_for_help(["--version"]) and not asks_for_help(["train", "--", "--help"])
    assert not asks_for_help(["train", "--data", "digits"]) and asks_for_help([])


def _entries(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    entries = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            entries += [(choice.dest, choice.help or "") for choice in action._choices_actions]
            for sub in action.choices.values():
                entries += _entries(sub)
            continue
        name = "/".join(action.option_strings) or action.dest
        entries.append((f"{parser.prog} {name}", action.help or ""))
    return entries


def test_every_help_entry_says_what_its_option_does():
    # A default alone ("(default 250)") does not say what the option is for.
    vague = []
    for name, text in _entries(build_parser()):
        words = re.sub(r"\([^()]*default[^()]*\)", "", text).split()
        if len(words) < 3:
            vague.append(f"{name}: {text!r}")
    assert vague == [], "help entries that do not say what the option does:\n" + "\n".join(vague)
