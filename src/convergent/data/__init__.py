"""Offline data sources with checksums, and seeded splits in the shared batch format.

Sources are fetched once into ``$CONVERGENT_CACHE`` (default ``~/.cache/convergent``),
one folder each, every file checked against its recorded sha256::

    from convergent.data import load_splits
    splits = load_splits("digits", seed=0)   # Splits(train, validation, test, task, ...)
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
from convergent.data.loaders import load_splits, to_patches, tokenize
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

__all__ = [
    "FASHION_MNIST_CLASSES",
    "GENERATED_SOURCES",
    "PERTURBATIONS",
    "SOURCES",
    "BundledFile",
    "DataSource",
    "DataSourceError",
    "DebianPackage",
    "DictDataset",
    "Member",
    "PypiArchive",
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
    "perturb_token_embeddings",
    "perturbed_embeddings",
    "random_permeability",
    "random_split_indices",
    "solve_darcy",
    "source_dir",
    "to_patches",
    "tokenize",
    "word_embedding",
]
