"""Offline data sources with checksums, and seeded splits in the shared batch format.

Sources are fetched once into ``$CONVERGENT_CACHE`` (default ``~/.cache/convergent``),
one folder each, every file checked against its recorded sha256::

    from convergent.data import load_splits
    splits = load_splits("digits", seed=0)   # Splits(train, validation, test, task, ...)

A name is a registered source ("digits") or an ``hf:`` name ("hf:imdb", "hf:/path/to.csv");
``source_kind`` tells which ("registered" or "hub") and ``is_token_source`` whether its
splits are subword-tokenized text (taking ``tokenizer`` and ``max_length``).

The modules form layers; each imports only modules of earlier layers, and none
imports another inside a function (``tests/data/test_data_imports.py`` checks both):

1. ``cache`` (folders, checksums, locks), ``splits`` (``Splits``, ``DictDataset``),
   ``darcy_gen`` (the Darcy solver), ``perturb`` (embedding perturbations),
   ``text_noise`` (typos and word dropout on raw text)
2. ``recipes`` (how to fetch: PyPI, Debian, bundled files)
3. ``kinds`` (source names parsed into kinds; the table of handlers of prefixed kinds)
4. ``sources`` (the registry of named sources; ``fetch``, ``is_cached``)
5. ``parsers`` (cached files -> tensors)
6. ``text_loaders``, ``numeric_loaders`` (the splits of each registered source)
7. ``hub`` (``hf:`` sources; registers the ``hub`` kind in ``kinds``),
   ``loaders`` (``load_splits``, dispatching by kind)
"""

from convergent.data.cache import (
    DataSourceError,
    UnknownDataSourceError,
    cache_root,
    source_dir,
)
from convergent.data.darcy_gen import (
    darcy_operator,
    gaussian_random_field,
    generate_darcy,
    random_permeability,
    solve_darcy,
)
from convergent.data.hub import load_hub_dataset
from convergent.data.kinds import SourceSpec, parse_source, source_kind
from convergent.data.loaders import SPLIT_SOURCES, is_token_source, load_splits
from convergent.data.numeric_loaders import to_patches
from convergent.data.parsers import (
    FASHION_MNIST_CLASSES,
    load_austen,
    load_darcy,
    load_digits,
    load_fashion_mnist,
    load_rt_sentences,
    load_street_video,
    load_weather,
)
from convergent.data.perturb import (
    PERTURBATIONS,
    embedding_rms,
    perturb_token_embeddings,
    perturbed_embeddings,
    word_embedding,
)
from convergent.data.recipes import BundledFile, DebianPackage, Member, PypiArchive
from convergent.data.sources import (
    GENERATED_SOURCES,
    SOURCES,
    DataSource,
    describe_sources,
    fetch,
    get_source,
    is_cached,
    minilm_path,
)
from convergent.data.splits import DictDataset, Splits, random_split_indices
from convergent.data.text_loaders import tokenize
from convergent.data.text_noise import (
    TEXT_PERTURBATIONS,
    perturb_texts,
    typo_text,
    word_dropout,
)

__all__ = [
    "FASHION_MNIST_CLASSES",
    "GENERATED_SOURCES",
    "PERTURBATIONS",
    "SOURCES",
    "SPLIT_SOURCES",
    "TEXT_PERTURBATIONS",
    "BundledFile",
    "DataSource",
    "DataSourceError",
    "DebianPackage",
    "DictDataset",
    "Member",
    "PypiArchive",
    "SourceSpec",
    "Splits",
    "UnknownDataSourceError",
    "cache_root",
    "darcy_operator",
    "describe_sources",
    "embedding_rms",
    "fetch",
    "gaussian_random_field",
    "generate_darcy",
    "get_source",
    "is_cached",
    "is_token_source",
    "load_austen",
    "load_darcy",
    "load_digits",
    "load_fashion_mnist",
    "load_hub_dataset",
    "load_rt_sentences",
    "load_splits",
    "load_street_video",
    "load_weather",
    "minilm_path",
    "parse_source",
    "perturb_texts",
    "perturb_token_embeddings",
    "perturbed_embeddings",
    "random_permeability",
    "random_split_indices",
    "solve_darcy",
    "source_dir",
    "source_kind",
    "to_patches",
    "tokenize",
    "typo_text",
    "word_dropout",
    "word_embedding",
]
