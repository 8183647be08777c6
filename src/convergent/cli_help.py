"""``convergent --help`` in a tenth of a second: the parser's calls, recorded once, replayed.

Building the real parser imports what its help quotes (the data sources, the optimizers'
defaults, the mask options), which means torch: seconds. So the calls that build it
(``add_parser``, ``add_argument``, ...) are recorded into ``cli_help.json`` beside this
module, and a command line that asks for help (or the version) is parsed by a parser
replayed from that record: argparse itself then prints the same text for the same command,
importing nothing heavy. ``tests/test_cli_help.py`` fails when the record differs from what
the code builds; rewrite it with::

    python tools/record_cli_help.py
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("cli_help.json")
HELP_FLAGS = ("-h", "--help", "--version")
# The calls that return an object later calls are made on.
_MAKERS = ("add_parser", "add_subparsers", "add_argument_group", "add_mutually_exclusive_group")
_RECORDED = (*_MAKERS, "add_argument")
_TYPES: dict[str, Any] = {"Path": Path, "int": int, "float": float, "str": str}
_ACTIONS: dict[str, Any] = {"BooleanOptionalAction": argparse.BooleanOptionalAction}


def _encode(value: Any) -> Any:
    """A JSON form of an argument of a parser call (types, actions and paths by name)."""
    if isinstance(value, type) and value.__name__ in _TYPES:
        return {"type": value.__name__}
    if isinstance(value, type) and value.__name__ in _ACTIONS:
        return {"action": value.__name__}
    if isinstance(value, Path):
        return {"path": str(value)}
    if isinstance(value, tuple | list):
        return [_encode(item) for item in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"cannot record {value!r} ({type(value).__name__}) in the help record")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        ((kind, name),) = value.items()
        return {"type": _TYPES, "action": _ACTIONS}[kind][name] if kind != "path" else Path(name)
    if isinstance(value, list):
        return tuple(_decode(item) for item in value)
    return value


class Recording:
    """Stands in for an argparse object, passing each call on and recording the calls that
    shape the help: ``(object, method, args, kwargs)``, the object being the index of the
    call that made it (-1: the top parser)."""

    def __init__(self, target: Any, calls: list[list[Any]], index: int = -1) -> None:
        self._target, self._calls, self._index = target, calls, index

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        if name not in _RECORDED:
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            self._calls.append(
                [self._index, name, _encode(args), {k: _encode(v) for k, v in kwargs.items()}]
            )
            return (
                Recording(result, self._calls, len(self._calls) - 1) if name in _MAKERS else result
            )

        return call


def record(
    new_parser: Callable[[], argparse.ArgumentParser], populate: Callable[[Any], None]
) -> list[list[Any]]:
    """The calls ``populate`` makes on a parser from ``new_parser``."""
    calls: list[list[Any]] = []
    populate(Recording(new_parser(), calls))
    return calls


def replay(
    new_parser: Callable[[], argparse.ArgumentParser], calls: Sequence[Sequence[Any]]
) -> argparse.ArgumentParser:
    """A parser from ``new_parser`` with ``calls`` made on it again (no handlers: for help)."""
    parser = new_parser()
    made: dict[int, Any] = {-1: parser}
    for index, (target, name, args, kwargs) in enumerate(calls):
        result = getattr(made[target], name)(
            *_decode(args), **{key: _decode(value) for key, value in kwargs.items()}
        )
        if name in _MAKERS:
            made[index] = result
    return parser


def asks_for_help(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for help or the version (before any ``--``), or is empty (then
    argparse prints the usage and what is missing)."""
    words = list(argv)
    if not words:
        return True
    if "--" in words:
        words = words[: words.index("--")]
    return any(word in HELP_FLAGS for word in words)


def recorded_parser(
    new_parser: Callable[[], argparse.ArgumentParser],
) -> argparse.ArgumentParser | None:
    """The parser replayed from the record (None when there is none): it takes the same flags,
    choices and types as the real one, so it refuses a bad command line without the imports
    that building the real one takes."""
    if not RECORD.is_file():
        return None
    return replay(new_parser, json.loads(RECORD.read_text())["calls"])


def print_recorded_help(
    new_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]
) -> bool:
    """Parse ``argv`` with the recorded parser, which prints the help (or the version, or the
    usage error of an empty command line) and exits; False when there is no record or the
    record's parser does not exit (then the real parser must parse ``argv``)."""
    if not RECORD.is_file():
        return False
    parser = replay(new_parser, json.loads(RECORD.read_text())["calls"])
    parser.parse_known_args(argv)  # exits after printing the help
    return False


def write_record(
    new_parser: Callable[[], argparse.ArgumentParser],
    populate: Callable[[Any], None],
    path: Path = RECORD,
) -> Path:
    """Record the calls ``populate`` makes on a parser from ``new_parser`` into ``path``, one
    call a line (so that a changed flag is a one-line diff)."""
    calls = record(new_parser, populate)
    lines = ",\n".join(json.dumps(call) for call in calls)
    path.write_text(f'{{"calls": [\n{lines}\n]}}\n')
    return path
