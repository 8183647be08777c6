"""Raw parsers: each reads one cached source into plain Python lists or tensors.

These return the data as published (apart from the cleaning noted in each docstring);
the seeded splits, tokenization and normalization live in ``loaders.py``.
"""

from __future__ import annotations

import csv
import html
import io

import numpy as np
import torch

from convergent.data.sources import fetch

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
