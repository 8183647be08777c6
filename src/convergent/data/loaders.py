"""``load_splits``: fixed, seeded train/validation/test splits of every data source.

Batches follow the shared contract: token inputs as "input_ids"/"attention_mask", continuous
inputs as "inputs" [N, T, D], targets as "labels". The builders live in ``text_loaders.py``
and ``numeric_loaders.py``; prefixed kinds (``hf:``) bring theirs through the table of
``kinds.py``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from convergent.data.cache import DataSourceError
from convergent.data.kinds import REGISTERED, handlers_for, name_patterns, parse_source
from convergent.data.numeric_loaders import (
    darcy_gen_splits,
    darcy_splits,
    digits_splits,
    fashion_mnist_splits,
    weather_splits,
)
from convergent.data.sources import get_source
from convergent.data.splits import Splits
from convergent.data.text_loaders import austen_splits, rt_sentences_splits

_BUILDERS: dict[str, Callable[..., Splits]] = {
    "rt-sentences": rt_sentences_splits,
    "digits": digits_splits,
    "weather-hourly": weather_splits,
    "darcy-16": darcy_splits,
    "darcy-gen": darcy_gen_splits,
    "fashion-mnist": fashion_mnist_splits,
    "austen": austen_splits,
}
SPLIT_SOURCES: tuple[str, ...] = tuple(_BUILDERS)  # the sources load_splits takes by name


def _splits_builder(name: str) -> Callable[..., Splits]:
    """The function that builds the splits of ``name``, called with ``seed`` and options."""
    spec = parse_source(name)
    if spec.kind != REGISTERED:
        return functools.partial(handlers_for(spec).splits, name)
    if name in _BUILDERS:
        return _BUILDERS[name]
    get_source(name)  # an unknown name: raises with the list of known ones
    raise DataSourceError(
        f"Data source {name!r} is not a dataset and has no splits; sources with splits: "
        f"{', '.join([*_BUILDERS, *name_patterns()])}."
    )


def _options_of(builder: Callable[..., Splits]) -> set[str]:
    return set(inspect.signature(builder).parameters) - {"seed"}


def is_token_source(name: str) -> bool:
    """Whether ``load_splits(name)`` gives text cut by a subword tokenizer, and so takes the
    ``tokenizer`` and ``max_length`` options: rt-sentences and every ``hf:`` source.

    Austen is character-level (its ids are characters; it takes ``seq_len``), so False, as
    for every other source and for unknown names.
    """
    try:
        builder = _splits_builder(name)
    except DataSourceError:
        return False
    return "max_length" in _options_of(builder)


def load_splits(name: str, *, seed: int = 0, **options: Any) -> Splits:
    """Fixed, seeded train/validation/test splits of a data source.

    Args:
        name: "rt-sentences", "digits", "weather-hourly", "darcy-16", "darcy-gen",
            "fashion-mnist", "austen" or "hf:<dataset or path>".
        seed: the split's seed (the by-position splits of weather and austen ignore it).
        **options: per source: rt-sentences and hf: take ``tokenizer`` (default MiniLM's)
            and ``max_length`` (64); hf: also ``text_column``, ``label_column``, ``config``;
            weather-hourly takes ``window`` (24); darcy-16 takes ``patch`` (4);
            darcy-gen takes ``resolution`` (16), ``patch`` (4), ``train_size`` (1000) and
            ``test_size`` (100);
            fashion-mnist takes ``patch`` (7), ``size`` (28) and ``validation_size`` (5000);
            austen takes ``seq_len`` (128).

    Returns:
        The splits, with task, num_outputs, seq_len and vocab_size or input_dim.
    """
    builder = _splits_builder(name)
    accepted = _options_of(builder)
    unexpected = sorted(set(options) - accepted)
    if unexpected:
        raise ValueError(
            f"Option(s) {unexpected} do not apply to data source {name!r}; "
            f"it accepts: {sorted(accepted) or 'no options'}."
        )
    return builder(seed=seed, **options)
