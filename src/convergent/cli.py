"""The ``convergent`` command: the top parser, the table of commands, and the dispatch.

Each command is a module of :mod:`convergent.commands` (see :data:`COMMAND_MODULES`) that adds its
own parser with ``add_parser(commands)`` and does its work in the handler it sets; this
module parses the command line, words errors for it, and calls that handler.

User mistakes (an unknown source, a value out of range, a missing checkpoint) print one
sentence and exit with status 2; set ``CONVERGENT_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from convergent import __version__

USER_ERROR_STATUS = 2

# Each command's module, in the order --help lists them: it adds the command's parser
# (``add_parser(commands)``), whose handler does the command's work.
COMMAND_MODULES = {
    "train": "convergent.commands.train_command",
    "data": "convergent.commands.data_command",
    "prune": "convergent.commands.prune_command",
    "bench": "convergent.commands.bench_command",
    "diagnose": "convergent.commands.diagnose_command",
    "reproduce": "convergent.commands.reproduce",
    "report": "convergent.commands.report",
}


def _user_error_types() -> tuple[type[BaseException], ...]:
    from convergent.commands.flags import UserError
    from convergent.data import DataSourceError
    from convergent.train import CheckpointError, TrainingDiverged

    return (
        UserError,
        ValueError,
        DataSourceError,
        CheckpointError,
        FileNotFoundError,
        TrainingDiverged,
    )


class _Parser(argparse.ArgumentParser):
    """argparse's parser, which also says "did you mean ...?" for a misspelled choice."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            from convergent.wording import did_you_mean

            choices = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r} (choose from {choices})"
                f"{did_you_mean(value, map(str, action.choices))}",
            )


def parse_command_line(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(words)``, except that a flag the command lacks is refused by that
    command's parser (its usage, not the top one's) with the flags closest to it."""
    from convergent.wording import did_you_mean

    arguments, unknown = parser.parse_known_args(words)
    if unknown:
        command = _subparser(parser, getattr(arguments, "command", None)) or parser
        flags = [flag for action in command._actions for flag in action.option_strings]
        guesses = "".join(
            did_you_mean(word.split("=", 1)[0], flags) for word in unknown if word.startswith("-")
        )
        command.error(f"unrecognized arguments: {' '.join(unknown)}{guesses}")
    return arguments


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> Any:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return None


def new_parser() -> argparse.ArgumentParser:
    """The top parser of the ``convergent`` command, without its commands."""
    parser = _Parser(
        prog="convergent",
        description="Train Transformers whose training dynamics you can trust.",
    )
    parser.add_argument("--version", action="version", version=f"convergent {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    return parser


def add_commands(parser: Any, only: str | None = None) -> None:
    """Add every command, or the command ``only``, to ``parser`` (a :func:`new_parser`, or a
    recording of one, see :mod:`convergent.cli_help`)."""
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMAND_MODULES.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(commands)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``convergent`` command: of every command, or of the command
    ``only`` (which imports that command's module alone: the others' imports, the studies'
    among them, take seconds of CPU that a ``convergent train`` process need not spend)."""
    parser = new_parser()
    add_commands(parser, only)
    return parser


# Options whose flag is not their keyword name with dashes, for messages (see wording.option).
_FLAG_NAMES = {"save_to": "--save", "run_dir": "--out"}


def _command_options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    """The keyword names of the options of ``command``: its subparser's destinations, and the
    names that ``_FLAG_NAMES`` spells as one of its flags."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            dests = {option.dest for option in action.choices[command]._actions}
            aliases = {
                name
                for name, flag in _FLAG_NAMES.items()
                if flag.removeprefix("--").replace("-", "_") in dests
            }
            return dests | aliases
    return set()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    A process that ``torchrun`` launched (the command line itself, not a call with ``argv``)
    ends here with `os._exit` once its command has finished and every rank has left the process
    group: at interpreter exit, gloo's worker threads could abort a rank whose work was all done
    and written ("terminate called without an active exception", one rank in about 15 resumed
    two-rank runs on a loaded 2-core machine), and torchrun then reports the run as failed.
    """
    status = _run(argv)
    if argv is None and "TORCHELASTIC_RUN_ID" in os.environ:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(status)
    return status


def _run(argv: Sequence[str] | None) -> int:
    from convergent.cli_help import asks_for_help, print_recorded_help, recorded_parser
    from convergent.wording import command_line

    words = sys.argv[1:] if argv is None else list(argv)
    if asks_for_help(words):
        print_recorded_help(new_parser, words)  # exits, unless there is no record to replay
    # The recorded parser refuses a bad flag, choice or number before the heavy imports that
    # building the real parser takes (torch, transformers: seconds).
    recorded = recorded_parser(new_parser)
    chosen = None if recorded is None else parse_command_line(recorded, words).command
    parser = build_parser(chosen)  # a command line the record took names a real command
    arguments = parse_command_line(parser, words)
    logging.basicConfig(
        level=logging.INFO if arguments.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with command_line(_command_options(parser, arguments.command), _FLAG_NAMES):
        if os.environ.get("CONVERGENT_DEBUG"):
            return int(arguments.handler(arguments))
        try:
            return int(arguments.handler(arguments))
        except _user_error_types() as error:
            text = str(error).strip()
            message = text.splitlines()[0] if text else type(error).__name__
            print(f"convergent: error: {message}", file=sys.stderr)
            return USER_ERROR_STATUS
        except KeyboardInterrupt:
            print("convergent: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
