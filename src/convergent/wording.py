"""How a mistake is told to the user, in the words of the interface they are using.

A message names an option through :func:`option`: ``include_embeddings=True`` to a Python
caller, ``--include-embeddings`` under the ``convergent`` command, which runs each command
inside :func:`command_line`. A misspelled choice gets :func:`did_you_mean`.

    raise ValueError(f"{option('lr')} must be positive, got {lr}")  # "--lr must be ..." in the CLI
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class _CommandLine:
    """The running command's options (keyword names) and the flags spelled otherwise."""

    options: frozenset[str] | None = None  # None: not known, take every option as given
    flags: Mapping[str, str] = field(default_factory=dict)


_COMMAND: contextvars.ContextVar[_CommandLine | None] = contextvars.ContextVar(
    "convergent_command_line", default=None
)
_UNSET: Any = object()


@contextlib.contextmanager
def command_line(
    options: Iterable[str] | None = None, flags: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Word messages for the command line while the block runs.

    Args:
        options: the keyword names of the running command's options (``include_embeddings``
            for ``--include-embeddings``); :func:`has_option` answers from them.
        flags: options whose flag is not the keyword name with dashes, e.g.
            ``{"save_to": "--save"}``.
    """
    token = _COMMAND.set(_CommandLine(None if options is None else frozenset(options), flags or {}))
    try:
        yield
    finally:
        _COMMAND.reset(token)


def option(name: str, value: Any = _UNSET) -> str:
    """Option ``name`` (given ``value``, if any) as the user spells it.

    Python: ``lr``, ``include_first=False``, ``pattern='2:4'``. Command line: ``--lr``,
    ``--no-include-first``, ``--pattern 2:4``.
    """
    command = _COMMAND.get()
    if command is None:
        return name if value is _UNSET else f"{name}={value!r}"
    flag = command.flags.get(name, "--" + name.replace("_", "-"))
    if value is _UNSET or value is True:
        return flag
    if value is False:
        return f"--no-{flag.removeprefix('--')}"
    return f"{flag} {value}"


def has_option(name: str) -> bool:
    """Whether the user can pass option ``name`` here: always in Python; under the command
    line, whether the running command has that flag (so that no message suggests one it
    lacks)."""
    command = _COMMAND.get()
    return command is None or command.options is None or name in command.options


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'wanda'?"`` for the choices closest to a misspelled ``value`` (none
    close: ``""``)."""
    close = difflib.get_close_matches(str(value), [str(choice) for choice in choices], n=2)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(choice) for choice in close) + "?"


def unknown_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """``"--model must be one of transformer, minilm, got 'minlm'; did you mean 'minilm'?"``"""
    listed = [str(choice) for choice in choices]
    return (
        f"{option(name)} must be one of {', '.join(listed)}, got {value!r}"
        f"{did_you_mean(value, listed)}"
    )
