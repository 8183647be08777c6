"""``hf:`` sources: a Hugging Face dataset by name (online), or a local file or folder.

``hf:imdb`` loads a dataset from the Hub with ``datasets.load_dataset``; ``hf:`` followed by
the path of a csv, json, jsonl or parquet file, or of a ``save_to_disk`` folder, works
offline. Arrow caches go under the convergent cache, in ``huggingface/``.

Importing this module registers the ``hub`` kind's handlers in ``kinds.py``, through which
``fetch``, ``is_cached`` and ``load_splits`` reach them (``convergent.data`` imports it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from convergent.data.cache import DataSourceError, cache_root
from convergent.data.kinds import HUB, SourceKindHandlers, parse_source, register_source_kind
from convergent.data.splits import Splits, random_split_indices
from convergent.data.text_loaders import token_classification_splits

TEXT_COLUMNS = ("text", "sentence", "content", "review", "document")
LABEL_COLUMNS = ("label", "labels", "sentiment", "class")
_FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_VALIDATION_NAMES = ("validation", "valid", "dev")


def _datasets_module() -> Any:
    try:
        import datasets
    except ImportError as error:
        raise DataSourceError(
            "hf: data sources need the `datasets` package; install it with "
            "`pip install 'convergent[hf]'` (or `pip install datasets`)."
        ) from error
    return datasets


def local_path(spec: str) -> Path | None:
    """The local file or folder an ``hf:`` spec names, or None for a Hub dataset name."""
    path = Path(parse_source(spec).target).expanduser()
    return path if path.exists() else None


def load_hub_dataset(spec: str, config: str | None = None) -> Any:
    """Load an ``hf:`` spec as a ``datasets.DatasetDict`` (a single file becomes "train")."""
    datasets = _datasets_module()
    target = parse_source(spec).target
    path = local_path(spec)
    cache_dir = str(cache_root() / "huggingface")
    try:
        if path is not None and path.is_dir():
            loaded = datasets.load_from_disk(str(path))
        elif path is not None:
            builder = _FILE_BUILDERS.get("".join(path.suffixes[-1:]).lower())
            if builder is None:
                raise DataSourceError(
                    f"Local file {path} has an unsupported type; use one of {sorted(_FILE_BUILDERS)}."
                )
            loaded = datasets.load_dataset(builder, data_files=str(path), cache_dir=cache_dir)
        else:
            loaded = datasets.load_dataset(target, config, cache_dir=cache_dir)
    except DataSourceError:
        raise
    except Exception as error:
        raise DataSourceError(
            f"Data source {spec!r} cannot be loaded: {type(error).__name__}: {error}; to fix it, "
            "connect to the Hugging Face Hub, or name a local csv/json/jsonl/parquet file or "
            "save_to_disk folder as hf:/path/to/it."
        ) from error
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    return loaded


def fetch_hub(spec: str) -> Path:
    """For ``fetch``: the local path, or the cache folder after loading a Hub dataset once."""
    path = local_path(spec)
    if path is not None:
        return path
    load_hub_dataset(spec)
    return cache_root() / "huggingface"


def is_hub_cached(spec: str) -> bool:
    """True for an existing local path; False for a Hub name (the datasets cache decides)."""
    return local_path(spec) is not None


def _pick_column(
    names: list[str], requested: str | None, candidates: tuple[str, ...], kind: str
) -> str:
    if requested is not None:
        if requested not in names:
            raise ValueError(
                f"The {kind} column {requested!r} is not in the dataset; it has {names}."
            )
        return requested
    for candidate in candidates:
        if candidate in names:
            return candidate
    raise ValueError(
        f"No {kind} column found among {names}; pass {kind}_column= (tried {list(candidates)})."
    )


def _split_indices(
    sizes: dict[str, int], labelled: torch.Tensor, validation_name: str | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train/validation/test indices into the pooled rows (pooled in the order of ``sizes``)."""
    starts = torch.tensor([0, *sizes.values()]).cumsum(0).tolist()
    ranges = {
        name: torch.arange(start, start + size)
        for (name, size), start in zip(sizes.items(), starts, strict=False)
    }

    def usable(name: str | None) -> bool:
        return name in ranges and bool(labelled[ranges[name]].all())

    if usable("train") and usable("test"):
        train, test = ranges["train"], ranges["test"]
        if usable(validation_name):
            return train, ranges[str(validation_name)], test
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
        count = int(0.1 * len(train))
        return train[order[count:]], train[order[:count]], test
    pool = torch.cat(list(ranges.values()))
    pool = pool[labelled[pool]]
    train, validation, test = random_split_indices(len(pool), seed)
    return pool[train], pool[validation], pool[test]


def hub_splits(
    spec: str,
    seed: int = 0,
    tokenizer: Any = None,
    max_length: int = 64,
    text_column: str | None = None,
    label_column: str | None = None,
    config: str | None = None,
) -> Splits:
    """Text classification splits of an ``hf:`` source, tokenized like rt-sentences.

    A labelled "train" and "test" are kept as they are, with the dataset's "validation"
    (or "valid"/"dev") if labelled, else 10 % of train drawn with ``seed``. Otherwise (a
    local file has only "train"; some test sets are unlabelled, label -1) the labelled rows
    of the standard splits are pooled and split 80/10/10 with ``seed``. Text and label
    columns are detected ("text"/"sentence"/..., "label"/...) unless named. String labels
    become indices in sorted order (``info["label_names"]``).
    """
    loaded = load_hub_dataset(spec, config)
    validation_name = next((name for name in _VALIDATION_NAMES if name in loaded), None)
    standard = [name for name in ("train", validation_name, "test") if name is not None]
    names = [name for name in standard if name in loaded] or list(loaded)
    first = loaded[names[0]]
    text = _pick_column(first.column_names, text_column, TEXT_COLUMNS, "text")
    label = _pick_column(first.column_names, label_column, LABEL_COLUMNS, "label")
    texts: list[str] = []
    raw_labels: list[Any] = []
    for name in names:
        texts.extend(str(value) for value in loaded[name][text])
        raw_labels.extend(loaded[name][label])
    label_names: list[str] | None = None
    if all(isinstance(value, str) for value in raw_labels):
        label_names = sorted(set(raw_labels))
        positions = {value: index for index, value in enumerate(label_names)}
        labels = torch.tensor([positions[value] for value in raw_labels])
    elif all(isinstance(value, int) and not isinstance(value, bool) for value in raw_labels):
        labels = torch.tensor(raw_labels)
    else:
        raise ValueError(f"Labels of column {label!r} must be all integers or all strings.")
    feature = first.features.get(label)
    num_classes = getattr(feature, "num_classes", None) or int(labels.max()) + 1
    sizes = {name: len(loaded[name]) for name in names}
    indices = _split_indices(sizes, labels >= 0, validation_name, seed)
    splits = token_classification_splits(
        texts, labels, seed, tokenizer, max_length, num_classes, indices
    )
    splits.info["label_names"] = label_names
    splits.info["text_column"], splits.info["label_column"] = text, label
    return splits


register_source_kind(
    HUB, SourceKindHandlers(fetch=fetch_hub, is_cached=is_hub_cached, splits=hub_splits)
)
