"""Source names parsed into kinds, and the table of what fetches and loads each kind.

A name is either a registered source ("digits", "darcy-gen", ...) or carries a kind's prefix
("hf:imdb", "hf:/data/reviews.csv" are ``hub`` sources). The name is parsed once into a
``SourceSpec``; ``fetch``, ``is_cached`` and ``load_splits`` then look the kind up in the
table instead of testing prefixes. Registered sources are handled by ``sources.py`` and
``loaders.py`` themselves; every prefixed kind registers its handlers here (``hub.py`` does
so when ``convergent.data`` is imported), so neither of those modules imports ``hub.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from convergent.data.cache import DataSourceError
from convergent.data.splits import Splits

REGISTERED = "registered"
HUB = "hub"
HUB_PREFIX = "hf:"


@dataclass(frozen=True)
class PrefixedKind:
    """A kind of source named by a prefix.

    Attributes:
        kind: the kind's name, e.g. "hub".
        prefix: what its source names start with, e.g. "hf:".
        pattern: how such a name is written, for error messages.
    """

    kind: str
    prefix: str
    pattern: str


PREFIXED_KINDS = (PrefixedKind(HUB, HUB_PREFIX, f"{HUB_PREFIX}<dataset name or local path>"),)


@dataclass(frozen=True)
class SourceSpec:
    """A data source name, parsed once.

    Attributes:
        name: the name as given, e.g. "digits" or "hf:imdb".
        kind: "registered" (a registered or generated source) or a prefixed kind ("hub").
        target: the name without its kind's prefix: the registry key, or for ``hub`` the
            dataset name or local path.
    """

    name: str
    kind: str
    target: str


def parse_source(name: str) -> SourceSpec:
    """Parse a data source name into its kind and target (the name without its prefix)."""
    for prefixed in PREFIXED_KINDS:
        if name.startswith(prefixed.prefix):
            return SourceSpec(name, prefixed.kind, name.removeprefix(prefixed.prefix))
    return SourceSpec(name, REGISTERED, name)


def source_kind(name: str) -> str:
    """The kind of a data source name: "registered" or "hub" (``hf:...``)."""
    return parse_source(name).kind


def name_patterns() -> list[str]:
    """How the names of prefixed kinds are written, e.g. ["hf:<dataset name or local path>"]."""
    return [prefixed.pattern for prefixed in PREFIXED_KINDS]


@dataclass(frozen=True)
class SourceKindHandlers:
    """What fetches and loads the sources of one prefixed kind.

    Attributes:
        fetch: full source name -> its local folder or file (as ``sources.fetch``).
        is_cached: full source name -> whether it is available without fetching.
        splits: builds ``Splits``; the full source name is its first positional argument,
            ``seed`` and the kind's options are keywords.
    """

    fetch: Callable[[str], Path]
    is_cached: Callable[[str], bool]
    splits: Callable[..., Splits]


_HANDLERS: dict[str, SourceKindHandlers] = {}


def register_source_kind(kind: str, handlers: SourceKindHandlers) -> None:
    """Register the handlers of a prefixed kind (a second registration replaces the first)."""
    if kind not in {prefixed.kind for prefixed in PREFIXED_KINDS}:
        raise ValueError(
            f"Source kind {kind!r} has no prefix; prefixed kinds: "
            f"{[prefixed.kind for prefixed in PREFIXED_KINDS]}."
        )
    _HANDLERS[kind] = handlers


def handlers_for(spec: SourceSpec) -> SourceKindHandlers:
    """The registered handlers of the kind of ``spec``."""
    if spec.kind not in _HANDLERS:
        raise DataSourceError(
            f"Data source {spec.name!r} is a {spec.kind!r} source, but nothing handles that "
            "kind yet; import convergent.data, which registers every kind."
        )
    return _HANDLERS[spec.kind]
