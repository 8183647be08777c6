"""Splits of the numeric sources: digit and clothing images, weather hours, Darcy flow.

Continuous inputs are "inputs" [N, T, D] (images and fields cut into patch tokens, weather
as windows of hours), targets "labels".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from convergent.data.darcy_gen import generate_darcy
from convergent.data.parsers import (
    FASHION_MNIST_CLASSES,
    load_darcy,
    load_digits,
    load_fashion_mnist,
    load_weather,
)
from convergent.data.splits import (
    DictDataset,
    Splits,
    random_split_indices,
    split_counts,
    standardize,
)


def digits_splits(seed: int = 0) -> Splits:
    """Digits as 8 tokens (image rows) of 8 features in [0, 1]; 10 classes; random 80/10/10."""
    images, labels = load_digits()
    dataset = DictDataset({"inputs": images / 16.0, "labels": labels})
    train, validation, test = random_split_indices(len(dataset), seed)
    return Splits(
        train=dataset.subset(train),
        validation=dataset.subset(validation),
        test=dataset.subset(test),
        task="classification",
        num_outputs=10,
        seq_len=8,
        input_dim=8,
        info={"indices": {"train": train, "validation": validation, "test": test}},
    )


def weather_splits(seed: int = 0, window: int = 24) -> Splits:
    """Forecast the next hour of every weather variable from the previous ``window`` hours.

    The split is chronological, not random: the first 80 % of the hours are train, the
    next 10 % validation, the last 10 % test, and every window (inputs and target) lies
    inside one block, so no hour is seen by two splits. All variables are standardized
    with the mean and std of the training hours only. The seed is accepted for a uniform
    interface but changes nothing.
    """
    del seed
    values, columns = load_weather()
    hours = len(values)
    counts = split_counts(hours, (0.8, 0.1, 0.1))
    if not 1 <= window < min(counts):
        raise ValueError(
            f"Weather window {window} is out of range; it must be in [1, {min(counts) - 1}]."
        )
    bounds = [0, counts[0], counts[0] + counts[1], hours]
    train_values = values[: bounds[1]]
    mean, std = train_values.mean(dim=0), train_values.std(dim=0)
    scaled = standardize(values, mean, std)
    datasets, target_hours, ranges = {}, {}, {}
    for name, start, stop in zip(
        ("train", "validation", "test"), bounds[:-1], bounds[1:], strict=True
    ):
        starts = torch.arange(start, stop - window)
        offsets = torch.arange(window)
        datasets[name] = DictDataset(
            {"inputs": scaled[starts[:, None] + offsets], "labels": scaled[starts + window]}
        )
        target_hours[name] = starts + window
        ranges[name] = (start, stop)
    return Splits(
        train=datasets["train"],
        validation=datasets["validation"],
        test=datasets["test"],
        task="regression",
        num_outputs=len(columns),
        seq_len=window,
        input_dim=len(columns),
        info={
            "columns": columns,
            "mean": mean,
            "std": std,
            "hour_ranges": ranges,
            "target_hours": target_hours,
        },
    )


def to_patches(fields: torch.Tensor, patch: int) -> torch.Tensor:
    """Cut [N, H, W] fields into non-overlapping patch x patch squares, row-major:
    [N, (H / patch) * (W / patch), patch * patch]."""
    count, height, width = fields.shape
    grid = fields.reshape(count, height // patch, patch, width // patch, patch)
    return grid.permute(0, 1, 3, 2, 4).reshape(count, -1, patch * patch)


def field_regression_splits(
    seed: int,
    resolution: int,
    patch: int,
    load: Callable[[], dict[str, torch.Tensor]],
    **info: Any,
) -> Splits:
    """Coefficient fields as patch x patch tokens -> the flattened solutions, the builder
    shared by darcy-16 and darcy-gen.

    ``load`` (called once the patch size is checked) gives "train_x", "train_y", "test_x"
    and "test_y" [N, resolution, resolution]. Test is the test set as it is; validation is
    10 % of the train set drawn with ``seed``. Inputs and labels are standardized (one
    scalar mean and std each) with the statistics of the remaining training examples;
    ``info`` keeps those four, ``patch``, ``resolution`` and the keywords in ``info``.
    """
    if patch < 1 or resolution % patch:
        raise ValueError(
            f"Patch size {patch} must be positive and divide the resolution {resolution}."
        )
    data = load()
    train, validation, _ = random_split_indices(len(data["train_x"]), seed, (0.9, 0.1, 0.0))
    inputs_mean, inputs_std = data["train_x"][train].mean(), data["train_x"][train].std()
    labels_mean, labels_std = data["train_y"][train].mean(), data["train_y"][train].std()

    def build(x: torch.Tensor, y: torch.Tensor) -> DictDataset:
        return DictDataset(
            {
                "inputs": to_patches(standardize(x, inputs_mean, inputs_std), patch),
                "labels": standardize(y, labels_mean, labels_std).flatten(1),
            }
        )

    return Splits(
        train=build(data["train_x"][train], data["train_y"][train]),
        validation=build(data["train_x"][validation], data["train_y"][validation]),
        test=build(data["test_x"], data["test_y"]),
        task="regression",
        num_outputs=resolution * resolution,
        seq_len=(resolution // patch) ** 2,
        input_dim=patch * patch,
        info={
            "inputs_mean": inputs_mean,
            "inputs_std": inputs_std,
            "labels_mean": labels_mean,
            "labels_std": labels_std,
            "patch": patch,
            "resolution": resolution,
            **info,
        },
    )


def darcy_splits(seed: int = 0, resolution: int = 16, patch: int = 4) -> Splits:
    """Darcy flow: coefficient field as 4x4 patches (16 tokens x 16 features) -> the
    flattened 16x16 solution [N, 256].

    Test is the official test file (50); validation is 10 % of the official train file
    (100), drawn with ``seed``. Inputs and labels are standardized (one scalar mean and
    std each, kept in ``info``) with the statistics of the remaining training examples.
    """
    return field_regression_splits(seed, resolution, patch, lambda: load_darcy(resolution))


def darcy_gen_splits(
    seed: int = 0,
    resolution: int = 16,
    patch: int = 4,
    train_size: int = 1000,
    test_size: int = 100,
) -> Splits:
    """Generated Darcy flow at any resolution, laid out as darcy-16: coefficient field as
    patch x patch tokens -> the flattened solution [N, resolution ** 2].

    ``train_size`` pairs are generated (``generate_darcy``) with seed ``seed`` and
    ``test_size`` new ones with seed ``seed + 1``, so the test fields are not training
    fields (but the test set of seed s is the start of the train set of seed s + 1: do not
    test one seed's model on another seed's splits). Validation is 10 % of the generated
    train set drawn with ``seed``; standardization as for darcy-16. ``info`` also keeps
    ``train_seed`` and ``test_seed``. Generation takes a few ms per pair at 16x16.
    """
    if train_size < 10:
        raise ValueError(
            f"train_size {train_size} is out of range; it must be at least 10 (a tenth of it "
            "is the validation set)."
        )
    if test_size < 1:
        raise ValueError(f"test_size {test_size} is out of range; it must be at least 1.")

    def load() -> dict[str, torch.Tensor]:
        train = generate_darcy(train_size, resolution, seed)
        test = generate_darcy(test_size, resolution, seed + 1)
        return {
            "train_x": train["x"],
            "train_y": train["y"],
            "test_x": test["x"],
            "test_y": test["y"],
        }

    return field_regression_splits(
        seed, resolution, patch, load, train_seed=seed, test_seed=seed + 1
    )


def fashion_mnist_splits(
    seed: int = 0, patch: int = 7, size: int = 28, validation_size: int = 5000
) -> Splits:
    """Fashion-MNIST as non-overlapping patches: with the defaults, 16 tokens (4 x 4 patches of
    7 x 7) of 49 features in [0, 1]; 10 classes.

    Test is the official test set (10,000); validation is ``validation_size`` images of the
    official training set drawn with ``seed``, train the rest (55,000 by default). With
    ``size`` < 28 the images are first shrunk by area averaging (``size=14`` and ``patch=7``
    give 4 tokens of 49 features), for quick studies.
    """
    if not 1 <= size <= 28:
        raise ValueError(f"Fashion-MNIST size {size} is out of range; it must be in [1, 28].")
    if patch < 1 or size % patch:
        raise ValueError(f"Patch size {patch} must be positive and divide the image size {size}.")
    data = load_fashion_mnist()
    total = len(data["train_labels"])
    if not 1 <= validation_size < total:
        raise ValueError(
            f"Validation size {validation_size} is out of range; it must be in [1, {total - 1}]."
        )
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    train, validation = order[validation_size:], order[:validation_size]

    def build(images: torch.Tensor, labels: torch.Tensor) -> DictDataset:
        scaled = images.to(torch.float32) / 255.0
        if size != scaled.shape[-1]:
            scaled = F.interpolate(scaled.unsqueeze(1), size=(size, size), mode="area").squeeze(1)
        return DictDataset({"inputs": to_patches(scaled, patch), "labels": labels})

    return Splits(
        train=build(data["train_images"][train], data["train_labels"][train]),
        validation=build(data["train_images"][validation], data["train_labels"][validation]),
        test=build(data["test_images"], data["test_labels"]),
        task="classification",
        num_outputs=len(FASHION_MNIST_CLASSES),
        seq_len=(size // patch) ** 2,
        input_dim=patch * patch,
        info={
            "classes": FASHION_MNIST_CLASSES,
            "patch": patch,
            "size": size,
            "indices": {"train": train, "validation": validation},
        },
    )
