"""Source names parsed into kinds, and the questions callers ask of a name."""

from __future__ import annotations

from typing import NoReturn

import pytest

from convergent.data import (
    GENERATED_SOURCES,
    SOURCES,
    SourceSpec,
    is_token_source,
    parse_source,
    source_kind,
)
from convergent.data.kinds import SourceKindHandlers, register_source_kind


def test_names_parse_into_kind_and_target() -> None:
    assert parse_source("digits") == SourceSpec("digits", "registered", "digits")
    assert parse_source("hf:imdb") == SourceSpec("hf:imdb", "hub", "imdb")
    assert parse_source("hf:/data/a.csv").target == "/data/a.csv"
    # Only a leading prefix counts.
    assert source_kind("my-hf:thing") == "registered"
    assert [source_kind(name) for name in [*SOURCES, *GENERATED_SOURCES]] == ["registered"] * (
        len(SOURCES) + len(GENERATED_SOURCES)
    )


def test_token_sources_are_rt_sentences_and_every_hub_source() -> None:
    token_sources = [name for name in [*SOURCES, *GENERATED_SOURCES] if is_token_source(name)]
    assert token_sources == ["rt-sentences"]
    assert is_token_source("hf:imdb") and is_token_source("hf:/data/reviews.csv")
    # Austen's ids are characters; a model folder and an unknown name have no splits.
    assert not is_token_source("austen")
    assert not is_token_source("minilm-l6") and not is_token_source("no-such-source")


def test_only_prefixed_kinds_take_handlers() -> None:
    def never(name: str) -> NoReturn:
        raise AssertionError(name)

    handlers = SourceKindHandlers(fetch=never, is_cached=never, splits=never)
    with pytest.raises(ValueError, match="'registered' has no prefix"):
        register_source_kind("registered", handlers)
