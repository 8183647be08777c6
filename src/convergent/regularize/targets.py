"""Which parameters a Villani regularizer penalizes, chosen by name.

Targets are parameter names of `model.named_parameters()`, chosen by regular expressions
(`re.search`) or shell globs (`fnmatch`), or by a preset (`PRESETS`): "query_key" is W_Q and W_K
of our `Transformer` (`q_proj`, `k_proj`) and of Hugging Face BERT (`query`, `key`); "lora" is
the LoRA factors A and B of a PEFT model (`lora_pairs` pairs each A with its B).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Sequence
from typing import Literal

from torch import nn

__all__ = ["PRESETS", "lora_pairs", "select_parameters"]

Syntax = Literal["regex", "glob"]
PRESETS: dict[str, tuple[str, ...]] = {
    "query_key": (r"(^|\.)(q_proj|query)\.weight$", r"(^|\.)(k_proj|key)\.weight$"),
    "lora": (r"(^|\.)lora_A\.", r"(^|\.)lora_B\."),
}
# The same projection under its two usual names (ours / Hugging Face BERT), for error hints.
_ALIASES = {
    "q_proj": "query",
    "k_proj": "key",
    "v_proj": "value",
    "query": "q_proj",
    "key": "k_proj",
    "value": "v_proj",
}
_LORA_A = re.compile(r"^(?P<prefix>.*)\.lora_A\.(?P<adapter>[^.]+)\.weight$")


def _matches(pattern: str, name: str, syntax: str) -> bool:
    if syntax == "glob":
        return fnmatch.fnmatchcase(name, pattern)
    return re.search(pattern, name) is not None


def _close_matches(pattern: str, names: Sequence[str]) -> list[str]:
    """Parameter names that look like `pattern`: by their dotted parts, then as a whole."""
    bare = re.sub(r"[^A-Za-z0-9_.]", "", pattern.replace(r"\.", ".")).strip(".")
    parts = sorted({part for name in names for part in name.split(".")})
    close_parts = set()
    for piece in [bare, *bare.split(".")]:
        close_parts.update(difflib.get_close_matches(piece, parts, n=3, cutoff=0.6))
        if _ALIASES.get(piece) in parts:
            close_parts.add(_ALIASES[piece])
    found = [name for name in names if close_parts & set(name.split("."))]
    found += difflib.get_close_matches(bare, names, n=3, cutoff=0.5)
    return list(dict.fromkeys(found))[:6]


def select_parameters(
    model: nn.Module, patterns: str | Iterable[str], syntax: Syntax = "regex"
) -> dict[str, nn.Parameter]:
    """The parameters of `model` whose names match any of `patterns`, in model order.

    Args:
        model: any module.
        patterns: a preset name (a key of `PRESETS`), or one pattern, or several; every
            pattern must match at least one parameter.
        syntax: "regex" (`re.search` on the full name) or "glob" (`fnmatch` on the full name,
            e.g. "*.q_proj.weight"); presets are always regular expressions.

    Raises:
        ValueError: naming a pattern that matches nothing, with the closest parameter names.
    """
    if syntax not in ("regex", "glob"):
        raise ValueError(f"syntax must be 'regex' or 'glob', got {syntax!r}.")
    if isinstance(patterns, str) and patterns in PRESETS:
        patterns, syntax = PRESETS[patterns], "regex"
    pattern_list = [patterns] if isinstance(patterns, str) else list(patterns)
    if not pattern_list:
        raise ValueError("patterns is empty; give a preset name or at least one pattern.")
    named = dict(model.named_parameters())
    selected: dict[str, nn.Parameter] = {}
    for pattern in pattern_list:
        if syntax == "regex":
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(
                    f"pattern {pattern!r} is not a valid regular expression: {error}."
                ) from None
        hits = [name for name in named if _matches(pattern, name, syntax)]
        if not hits:
            close = _close_matches(pattern, list(named))
            hint = f"close matches: {', '.join(close)}" if close else "no parameter name is close"
            raise ValueError(
                f"pattern {pattern!r} ({syntax}) matches no parameter of "
                f"{type(model).__name__}; {hint}."
            )
        selected.update({name: named[name] for name in hits})
    return {name: selected[name] for name in named if name in selected}


def lora_pairs(model: nn.Module) -> list[tuple[str, nn.Parameter, nn.Parameter]]:
    """(module name, A, B) for every PEFT LoRA layer: `X.lora_A.<adapter>.weight` with its B."""
    named = dict(model.named_parameters())
    pairs = []
    for name, parameter in named.items():
        found = _LORA_A.match(name)
        if found is None:
            continue
        partner = f"{found['prefix']}.lora_B.{found['adapter']}.weight"
        if partner not in named:
            raise ValueError(f"LoRA factor {name!r} has no partner {partner!r}.")
        pairs.append((f"{found['prefix']}.{found['adapter']}", parameter, named[partner]))
    if not pairs:
        close = _close_matches("lora_A", list(named))
        hint = f"close matches: {', '.join(close)}" if close else "no parameter name is close"
        raise ValueError(f"no LoRA factor (*.lora_A.*.weight) in {type(model).__name__}; {hint}.")
    return pairs
