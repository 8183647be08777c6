"""``load_splits``: fixed, seeded train/validation/test splits of every data source.

Batches follow the shared contract: token inputs as "input_ids"/"attention_mask", continuous
inputs as "inputs" [N, T, D], targets as "labels".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from convergent.data.cache import DataSourceError
from convergent.data.darcy_gen import generate_darcy
from convergent.data.parsers import (
    FASHION_MNIST_CLASSES,
    load_austen,
    load_darcy,
    load_digits,
    load_fashion_mnist,
    load_rt_sentences,
    load_weather,
)
from convergent.data.sources import HUB_PREFIX, get_source, minilm_path
from convergent.data.splits import (
    DictDataset,
    Splits,
    random_split_indices,
    split_counts,
    standardize,
)


def default_tokenizer() -> Any:
    """The uncased WordPiece tokenizer of the ``minilm-l6`` source, loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


def tokenize(texts: Sequence[str], tokenizer: Any, max_length: int) -> dict[str, torch.Tensor]:
    """Tokenize, truncate and pad every text to exactly ``max_length`` tokens.

    Returns:
        {"input_ids": long [N, max_length], "attention_mask": long [N, max_length]}.
    """
    if max_length < 2:
        raise ValueError(f"max_length {max_length} is too short; it must be at least 2.")
    encoded = tokenizer(
        list(texts),
        padding="max_length",
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return {
        "input_ids": encoded["input_ids"].long(),
        "attention_mask": encoded["attention_mask"].long(),
    }


def token_classification_splits(
    texts: Sequence[str],
    labels: torch.Tensor,
    seed: int,
    tokenizer: Any | None,
    max_length: int,
    num_classes: int,
    indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> Splits:
    """Tokenized texts with class labels, split at ``indices`` (train, validation, test)
    or, by default, 80/10/10 at random with ``seed``."""
    tokenizer = default_tokenizer() if tokenizer is None else tokenizer
    dataset = DictDataset({**tokenize(texts, tokenizer, max_length), "labels": labels.long()})
    if indices is None:
        indices = random_split_indices(len(dataset), seed)
    train, validation, test = indices
    return Splits(
        train=dataset.subset(train),
        validation=dataset.subset(validation),
        test=dataset.subset(test),
        task="classification",
        num_outputs=num_classes,
        seq_len=max_length,
        vocab_size=len(tokenizer),
        info={"indices": {"train": train, "validation": validation, "test": test}},
    )


def rt_sentences_splits(seed: int = 0, tokenizer: Any = None, max_length: int = 64) -> Splits:
    """Binary sentiment of the Rotten Tomatoes sentences: label 1 if the mean human score is
    positive, 0 if negative. The 37 sentences scored exactly 0 have no sign and are left
    out (10,568 remain). ``info["indices"]`` index into ``load_rt_sentences()``."""
    texts, scores = load_rt_sentences()
    signed = torch.nonzero(scores != 0).squeeze(1)
    splits = token_classification_splits(
        [texts[i] for i in signed.tolist()],
        (scores[signed] > 0).long(),
        seed,
        tokenizer,
        max_length,
        num_classes=2,
    )
    splits.info["indices"] = {key: signed[value] for key, value in splits.info["indices"].items()}
    splits.info["dropped_neutral"] = int((scores == 0).sum())
    return splits


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
        info={"columns": columns, "mean": mean, "std": std, "hour_ranges": ranges,
              "target_hours": target_hours},
    )  # fmt: skip


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
        info={"inputs_mean": inputs_mean, "inputs_std": inputs_std, "labels_mean": labels_mean,
              "labels_std": labels_std, "patch": patch, "resolution": resolution, **info},
    )  # fmt: skip


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
        return {"train_x": train["x"], "train_y": train["y"], "test_x": test["x"],
                "test_y": test["y"]}  # fmt: skip

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
        info={"classes": FASHION_MNIST_CLASSES, "patch": patch, "size": size,
              "indices": {"train": train, "validation": validation}},
    )  # fmt: skip


# The character language model's split of every novel, by position: train, validation, test.
AUSTEN_FRACTIONS = (0.9, 0.05, 0.05)
UNKNOWN_CHARACTER = "\ufffd"


def austen_splits(seed: int = 0, seq_len: int = 128) -> Splits:
    """Character-level language modelling on Jane Austen's six novels.

    Each novel is cut by position: its first 90 % of characters go to train, the next 5 % to
    validation and the last 5 % to test, so no passage is in two splits. Every block is cut
    into non-overlapping windows of ``seq_len`` + 1 characters (a remainder shorter than
    that is dropped, and no window crosses a block): "input_ids" are the first ``seq_len``
    characters, "labels" the same shifted by one (the next characters). The vocabulary is
    the sorted set of characters of the training blocks (80 ASCII characters, newline
    included), plus U+FFFD as a last entry when validation or test hold a character that is
    not in it, which then maps there: here "£", found only near the end of Mansfield Park,
    so the vocabulary has 81 entries. ``info`` keeps the vocabulary ("itos"), the
    character range of each split in each novel ("char_ranges": split -> title -> (start,
    stop)) and each window's origin ("window_starts": split -> long [N, 2] of (novel index,
    offset)). The seed is accepted for a uniform interface but changes nothing.
    """
    del seed
    books = load_austen()
    split_names = ("train", "validation", "test")
    char_ranges: dict[str, dict[str, tuple[int, int]]] = {name: {} for name in split_names}
    for title, text in books.items():
        train_count, validation_count, _ = split_counts(len(text), AUSTEN_FRACTIONS)
        bounds = (0, train_count, train_count + validation_count, len(text))
        for name, start, stop in zip(split_names, bounds[:-1], bounds[1:], strict=True):
            char_ranges[name][title] = (start, stop)
    shortest = min(
        stop - start for ranges in char_ranges.values() for start, stop in ranges.values()
    )
    if not 1 <= seq_len < shortest:
        raise ValueError(
            f"seq_len {seq_len} is out of range; it must be in [1, {shortest - 1}] (the "
            "shortest block of a novel)."
        )
    itos = sorted({c for title, (a, b) in char_ranges["train"].items() for c in books[title][a:b]})
    unknown = sorted(
        {c for name in split_names[1:] for title, (a, b) in char_ranges[name].items()
         for c in books[title][a:b]} - set(itos)
    )  # fmt: skip
    if unknown:
        itos.append(UNKNOWN_CHARACTER)
    largest_code = max(ord(max(text)) for text in [*books.values(), "".join(itos)])
    lookup = np.full(largest_code + 1, len(itos) - 1, dtype=np.int64)
    lookup[[ord(character) for character in itos]] = np.arange(len(itos))
    datasets, window_starts = {}, {}
    for name in split_names:
        inputs, labels, starts = [], [], []
        for book_index, (title, (start, stop)) in enumerate(char_ranges[name].items()):
            codes = np.frombuffer(books[title][start:stop].encode("utf-32-le"), dtype=np.uint32)
            ids = torch.from_numpy(lookup[codes])
            offsets = torch.arange(0, len(ids) - seq_len, seq_len)
            windows = ids[offsets[:, None] + torch.arange(seq_len + 1)]
            inputs.append(windows[:, :-1])
            labels.append(windows[:, 1:])
            starts.append(torch.stack([torch.full_like(offsets, book_index), offsets + start], 1))
        datasets[name] = DictDataset({"input_ids": torch.cat(inputs), "labels": torch.cat(labels)})
        window_starts[name] = torch.cat(starts)
    return Splits(
        train=datasets["train"],
        validation=datasets["validation"],
        test=datasets["test"],
        task="lm",
        num_outputs=len(itos),
        seq_len=seq_len,
        vocab_size=len(itos),
        info={"itos": itos, "books": list(books), "char_ranges": char_ranges,
              "window_starts": window_starts, "unknown_characters": unknown},
    )  # fmt: skip


_BUILDERS: dict[str, Callable[..., Splits]] = {
    "rt-sentences": rt_sentences_splits,
    "digits": digits_splits,
    "weather-hourly": weather_splits,
    "darcy-16": darcy_splits,
    "darcy-gen": darcy_gen_splits,
    "fashion-mnist": fashion_mnist_splits,
    "austen": austen_splits,
}


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
    if name.startswith(HUB_PREFIX):
        from convergent.data.hub import hub_splits

        builder: Callable[..., Splits] = hub_splits
        options = {"spec": name, **options}
    elif name in _BUILDERS:
        builder = _BUILDERS[name]
    else:
        get_source(name)  # an unknown name: raises with the list of known ones
        raise DataSourceError(
            f"Data source {name!r} is not a dataset and has no splits; sources with splits: "
            f"{', '.join([*_BUILDERS, HUB_PREFIX + '<dataset or path>'])}."
        )
    accepted = set(inspect.signature(builder).parameters) - {"seed", "spec"}
    unexpected = sorted(set(options) - accepted - {"spec"})
    if unexpected:
        raise ValueError(
            f"Option(s) {unexpected} do not apply to data source {name!r}; "
            f"it accepts: {sorted(accepted) or 'no options'}."
        )
    return builder(seed=seed, **options)
