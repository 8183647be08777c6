"""Raw parsers: each reads one cached source into plain Python lists or tensors.

These return the data as published (apart from the cleaning noted in each docstring);
the seeded splits, tokenization and normalization live in ``text_loaders.py`` and
``numeric_loaders.py``.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import html
import io
import logging
import lzma
import math
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from convergent.data.cache import DataSourceError, sha256_file
from convergent.data.sources import fetch

logger = logging.getLogger("convergent.data")

# TMY3 columns that are not measurements: the time stamp and the present-weather code,
# which is a categorical METAR code rather than a quantity.
_WEATHER_NON_MEASUREMENTS = ("Date (MM/DD/YYYY)", "Time (HH:MM)", "PresWth (METAR code)")


def load_rt_sentences() -> tuple[list[str], torch.Tensor]:
    """The Rotten Tomatoes sentences of Hutto & Gilbert (ICWSM 2014) with their sentiment.

    The file is UTF-8 with Windows line endings (CRLF) and a few HTML entities
    ("PB&amp; J"); it is decoded explicitly as UTF-8 (never with the locale's encoding)
    and the entities are unescaped.

    Returns:
        ``(texts, scores)``: 10,605 sentences in file order and a float32 tensor [10605] of
        mean human sentiment in [-4, 4]. 37 sentences have a score of exactly 0.
    """
    path = fetch("rt-sentences") / "movieReviewSnippets_GroundTruth.txt"
    text = path.read_bytes().decode("utf-8")
    texts, scores = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        _, score, sentence = line.split("\t", 2)
        texts.append(html.unescape(sentence.strip()))
        scores.append(float(score))
    return texts, torch.tensor(scores, dtype=torch.float32)


def weather_measurement_columns(header: list[str]) -> list[int]:
    """The indices of the measurement columns of a TMY3 header: no time stamp, no source or
    uncertainty flags, no present-weather code."""
    keep = []
    for index, column in enumerate(header):
        lowered = column.lower()
        if column in _WEATHER_NON_MEASUREMENTS or "source" in lowered or "uncert" in lowered:
            continue
        keep.append(index)
    return keep


def load_weather(drop_constant: bool = True) -> tuple[torch.Tensor, list[str]]:
    """The hourly TMY3 weather year of Greensboro, NC (station 723170), as a float tensor.

    The file's first line is site metadata, the second the header, then 8,760 hourly rows
    (a "typical" year: each month is taken from a different real year, in calendar order).
    Kept: the numeric measurement columns (irradiance, illuminance, cloud cover,
    temperatures, humidity, pressure, wind, visibility, ceiling height, precipitable water,
    precipitation). Dropped: date and time, every source and uncertainty flag, the
    categorical present-weather code and, by default, the columns that are constant over
    the year (aerosol optical depth, albedo and precipitation period here). Values are as
    published: ceiling height uses 77777 for "unlimited" (a clear sky).

    Args:
        drop_constant: drop the columns with a single value over the whole year.

    Returns:
        ``(values, columns)``: float32 [8760, C] in time order (C = 21 by default, 24 with
        constants) and the C column names as in the file's header.
    """
    path = fetch("weather-hourly") / "723170TYA.CSV"
    reader = csv.reader(io.StringIO(path.read_bytes().decode("ascii")))
    next(reader)  # site metadata: id, name, state, time zone, latitude, longitude, elevation
    header = next(reader)
    rows = [row for row in reader if row]
    keep = weather_measurement_columns(header)
    table = np.array([[float(row[index]) for index in keep] for row in rows], dtype=np.float64)
    columns = [header[index] for index in keep]
    if drop_constant:
        varying = table.max(axis=0) > table.min(axis=0)
        table = table[:, varying]
        columns = [column for column, kept in zip(columns, varying, strict=True) if kept]
    return torch.from_numpy(table.astype(np.float32)), columns


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's handwritten digits (read from the file it bundles, checksummed).

    Returns:
        ``(images, labels)``: float32 [1797, 8, 8] with integer intensities 0..16 and
        int64 [1797] labels 0..9.
    """
    path = fetch("digits") / "digits.csv"
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    images = torch.from_numpy(table[:, :-1].reshape(-1, 8, 8).copy())
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    return images, labels


def load_darcy(resolution: int = 16) -> dict[str, torch.Tensor]:
    """The small Darcy-flow set shipped with neuraloperator 0.3.0.

    Each file is a dict ``{"x": bool [N, 16, 16], "y": float32 [N, 16, 16]}``: the binary
    (two-valued) permeability field and the pressure solution of -div(a grad u) = 1.

    Args:
        resolution: the grid size; only 16 is available.

    Returns:
        ``{"train_x", "train_y", "test_x", "test_y"}``: x as float32 in {0, 1},
        [1000, 16, 16] for train and [50, 16, 16] for test; y float32 of the same shapes.
    """
    if resolution != 16:
        raise ValueError(f"Darcy resolution {resolution} is not available; the only one is 16.")
    folder = fetch("darcy-16")
    result = {}
    for split in ("train", "test"):
        data = torch.load(folder / f"darcy_{split}_16.pt", weights_only=True, map_location="cpu")
        result[f"{split}_x"] = data["x"].to(torch.float32)
        result[f"{split}_y"] = data["y"].to(torch.float32)
    return result


def read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte array from an idx file (the MNIST format), gzipped or not.

    The format: two zero bytes, a type code (0x08 = unsigned byte), the number of
    dimensions, each dimension as a big-endian uint32, then the values in C order.
    """
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file (it starts with {data[:4]!r}).")
    dimensions = data[3]
    shape = struct.unpack(f">{dimensions}I", data[4 : 4 + 4 * dimensions])
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dimensions)
    if values.size != math.prod(shape):
        raise ValueError(f"{path} holds {values.size} values, but its header says {shape}.")
    return values.reshape(shape)


# The class names of Fashion-MNIST, by label.
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def load_fashion_mnist() -> dict[str, torch.Tensor]:
    """Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017) as Debian ships it: Zalando's article
    images, 28x28 grayscale, in 10 classes (``FASHION_MNIST_CLASSES``), 6,000 train and
    1,000 test images per class.

    Returns:
        ``{"train_images", "train_labels", "test_images", "test_labels"}``: images uint8
        [60000, 28, 28] and [10000, 28, 28] (0 = background, 255 = ink), labels int64 0..9.
    """
    folder = fetch("fashion-mnist")
    result = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(folder / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz")
        result[f"{split}_images"] = torch.from_numpy(images.copy())
        result[f"{split}_labels"] = torch.from_numpy(labels.astype(np.int64))
    return result


def read_lazy_load_database(folder: Path, name: str = "Rdata") -> dict[str, Any]:
    """Every value of an R lazy-load database (``name.rdx`` index, ``name.rdb`` values), the
    format of an installed R package's ``data/`` folder, converted with ``rdata``.

    The index is a compressed RDS file: a list whose ``variables`` maps each name to the
    (offset, length) of its record in the ``.rdb`` file and whose ``compressed`` says how
    records are compressed. A record is the uncompressed size as a big-endian uint32, then
    (for ``compressed`` 2 or 3) a one-byte method tag, then the compressed serialized value.
    """
    import rdata  # a heavy import, needed for this source only

    def convert(serialized: bytes) -> Any:
        return rdata.conversion.convert(rdata.parser.parse_data(serialized, extension=".rds"))

    index = convert((folder / f"{name}.rdx").read_bytes())
    compression = int(np.asarray(index["compressed"]).item())
    values = (folder / f"{name}.rdb").read_bytes()
    result = {}
    for variable, (offset, length) in index["variables"].items():
        record = values[int(offset) : int(offset) + int(length)]
        if compression in (2, 3):
            method, payload = record[4:5], record[5:]
        else:
            method, payload = (b"Z" if compression else b"0"), record[4:]
        decompress = _R_DECOMPRESSORS.get(method)
        if decompress is None:
            raise ValueError(f"{folder / name}.rdb record {variable!r} uses unknown {method!r}.")
        result[str(variable)] = convert(decompress(payload))
    return result


_R_DECOMPRESSORS: dict[bytes, Callable[[bytes], bytes]] = {
    b"Z": zlib.decompress,
    b"2": bz2.decompress,
    b"X": lzma.decompress,
    b"0": bytes,
}

# janeaustenr's variable names and the book titles of `austen_books()`, in publication order.
AUSTEN_BOOKS = {
    "sensesensibility": "Sense & Sensibility",
    "prideprejudice": "Pride & Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}

# The sha256 of each novel's text (UTF-8, lines joined by "\n"), to trust the decoded copy.
_AUSTEN_TEXT_SHA256 = {
    "sensesensibility": "0996d90842bbe8093f3b8142c1e77d1b20cff52d1d0615f3ed67733653e74e26",
    "prideprejudice": "2e44edaa4946d64ad541c68e0224f5d672f43bf3ce2a8a0b0637ad5e02fc6eb3",
    "mansfieldpark": "e0e9ef3863ea77f51f6070062ee0dd50ad9b933223880617629e4e4963ea40ff",
    "emma": "dd08b340a56ad4a0a00718d5682528a5a5886ae0aef91c9e0fa528074fa64b75",
    "northangerabbey": "8618a5acf5be50cc6e9b7680c7469fb6012649ab08c709dfc63c6367989fd31d",
    "persuasion": "726513a6c18bb678427bcbcf7c72d0d20816a67c25b0471b26ddcabf3ebac140",
}


def load_austen() -> dict[str, str]:
    """Jane Austen's six completed novels, as the R package janeaustenr holds them (Project
    Gutenberg texts without the Gutenberg header and licence).

    Each novel is a character vector of lines in the package; the lines are joined with
    newlines (empty strings are the blank lines between paragraphs). Decoding with
    ``rdata`` takes a few seconds, so the decoded text is kept next to the cached files
    (``text/``, checked against its recorded sha256) and read from there afterwards.

    Returns:
        Title -> full text, in publication order: "Sense & Sensibility",
        "Pride & Prejudice", "Mansfield Park", "Emma", "Northanger Abbey", "Persuasion";
        4,025,022 characters in all, with an alphabet of 81 characters (ASCII and "£").
    """
    folder = fetch("austen")
    decoded = folder / "text"
    texts = {}
    for variable, title in AUSTEN_BOOKS.items():
        path = decoded / f"{variable}.txt"
        if path.is_file() and sha256_file(path) == _AUSTEN_TEXT_SHA256.get(variable):
            texts[title] = path.read_bytes().decode("utf-8")
    if len(texts) == len(AUSTEN_BOOKS):
        return texts
    books = read_lazy_load_database(folder)
    texts = {
        title: "\n".join(str(line) for line in books[variable])
        for variable, title in AUSTEN_BOOKS.items()
    }
    try:  # a read-only cache simply decodes every time
        decoded.mkdir(exist_ok=True)
        for variable, title in AUSTEN_BOOKS.items():
            content = texts[title].encode("utf-8")
            if hashlib.sha256(content).hexdigest() != _AUSTEN_TEXT_SHA256[variable]:
                logger.warning(
                    "The decoded text of %r differs from the recorded one (another rdata "
                    "version?); it is not cached.",
                    title,
                )
                continue
            staged = decoded / f".{variable}.txt.partial"
            staged.write_bytes(content)
            os.replace(staged, decoded / f"{variable}.txt")
    except OSError:
        pass
    return texts


def load_street_video(max_frames: int | None = None, gray: bool = True) -> torch.Tensor:
    """OpenCV's sample video ``vtest.avi``: a fixed camera over a pedestrian street, 795
    frames of 576x768 at 10 frames per second (MPEG-4 part 2, decoded with OpenCV).

    Args:
        max_frames: read only the first ``max_frames`` frames (all when None). The whole
            video takes 350 MB in gray and 1.05 GB in color.
        gray: convert to one luminance channel (OpenCV's BGR -> gray weights); otherwise
            return RGB.

    Returns:
        uint8 [F, 576, 768] in gray, or [F, 576, 768, 3] in RGB order.
    """
    import cv2  # a heavy import, needed for this source only

    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames {max_frames} is out of range; it must be at least 1.")
    path = fetch("street-video") / "vtest.avi"
    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        raise DataSourceError(
            f"OpenCV cannot open {path}; to fix it, install an OpenCV build with its video "
            "backend (pip install opencv-python-headless)."
        )
    conversion = cv2.COLOR_BGR2GRAY if gray else cv2.COLOR_BGR2RGB
    frames: list[np.ndarray] = []
    try:
        while max_frames is None or len(frames) < max_frames:
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(cv2.cvtColor(frame, conversion))
    finally:
        capture.release()
    if not frames:
        raise DataSourceError(f"OpenCV decoded no frame of {path}.")
    return torch.from_numpy(np.stack(frames))
