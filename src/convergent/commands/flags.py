"""What the command-line modules share: the user-error type and the flags that are built
from a dataclass's fields, so that each flag's help quotes its field's docstring and default
from their one definition.

A command module (``train_command``, ``prune_command``, ``reproduce``, ...) adds its parser
with ``add_parser(commands)`` and handles its parsed flags with ``run(arguments)``; the
``convergent`` command (:mod:`convergent.cli`) lists the modules and dispatches to them.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


class UserError(Exception):
    """A mistake in what the user asked for; reported as one sentence, no traceback."""


def field_help(cls: type, name: str) -> str:
    """The text of attribute ``name`` in ``cls``'s docstring (its Attributes section)."""
    lines = (cls.__doc__ or "").splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith(f"{name}:"):
            text = [line.strip()[len(name) + 1 :].strip()]
            for following in lines[index + 1 :]:
                if not following.startswith(" " * 12):
                    break
                text.append(following.strip())
            return " ".join(text).replace("``", "")
    return ""


# MaskSpec fields that only one-shot pruning reads (OWL's allocation): not `train` flags.
ONE_SHOT_FIELDS = ("owl_m", "owl_lmbda")


def add_mask_spec_arguments(group: Any, one_shot: bool = False) -> None:
    """One flag per :class:`~convergent.sparse.MaskSpec` field (their defaults are the spec's,
    quoted from it): ``--distribution``, ``--pattern``, ``--include-embeddings``, ...,
    ``--exclude NAME`` (repeatable); with ``one_shot``, OWL's ``--owl-m`` and
    ``--owl-lmbda`` and the ``owl`` distribution too."""
    from convergent.sparse import DISTRIBUTIONS, MaskSpec

    for field in dataclasses.fields(MaskSpec):
        if field.name in ONE_SHOT_FIELDS and not one_shot:
            continue
        flag = "--" + field.name.replace("_", "-")
        help_text = f"{field_help(MaskSpec, field.name).rstrip('.')} {_spec_default(field.default)}"
        if isinstance(field.default, bool):
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif field.name == "exclude":
            group.add_argument(flag, action="append", default=None, metavar="NAME", help=help_text)
        elif isinstance(field.default, float):
            group.add_argument(flag, type=float, default=None, help=help_text)
        else:
            choices = None
            if field.name == "distribution":
                choices = (
                    DISTRIBUTIONS if one_shot else tuple(d for d in DISTRIBUTIONS if d != "owl")
                )
            group.add_argument(flag, choices=choices, default=None, help=help_text)


def _spec_default(value: Any) -> str:
    """A mask option's default as its flag's help says it."""
    if isinstance(value, bool):
        return f"(default: {'on' if value else 'off'})"
    return f"(default {value})" if value else "(default: none)"


def mask_spec_from_arguments(arguments: argparse.Namespace) -> Any:
    """The :class:`~convergent.sparse.MaskSpec` of the flags given (the others: its defaults)."""
    from convergent.sparse import MaskSpec

    given = {
        field.name: getattr(arguments, field.name)
        for field in dataclasses.fields(MaskSpec)
        if getattr(arguments, field.name, None) is not None
    }
    if "exclude" in given:
        given["exclude"] = tuple(given["exclude"])
    return MaskSpec(**given)
