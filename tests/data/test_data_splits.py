"""load_splits: shapes, determinism, leakage-free weather split, normalization."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from convergent.data import DataSourceError, DictDataset, load_splits, load_weather, to_patches
from convergent.data.splits import random_split_indices

from .conftest import WhitespaceTokenizer


def test_dict_dataset_collates_to_batch_dicts() -> None:
    dataset = DictDataset({"inputs": torch.randn(5, 3, 2), "labels": torch.arange(5)})
    batch = next(iter(DataLoader(dataset, batch_size=4)))
    assert batch["inputs"].shape == (4, 3, 2) and batch["labels"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="one length"):
        DictDataset({"a": torch.zeros(3), "b": torch.zeros(4)})


def test_random_split_indices_partition_and_depend_on_the_seed() -> None:
    train, validation, test = random_split_indices(101, seed=0)
    assert (len(train), len(validation), len(test)) == (81, 10, 10)
    assert sorted(torch.cat([train, validation, test]).tolist()) == list(range(101))
    again = random_split_indices(101, seed=0)
    assert all(torch.equal(a, b) for a, b in zip((train, validation, test), again, strict=True))
    assert not torch.equal(train, random_split_indices(101, seed=1)[0])


def test_digits_splits() -> None:
    splits = load_splits("digits", seed=0)
    assert (splits.task, splits.num_outputs, splits.seq_len, splits.input_dim) == (
        "classification",
        10,
        8,
        8,
    )
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [
        1439,
        179,
        179,
    ]
    inputs = splits.train.tensors["inputs"]
    assert inputs.shape == (1439, 8, 8) and inputs.min() >= 0 and inputs.max() == 1
    same = load_splits("digits", seed=0)
    other = load_splits("digits", seed=1)
    assert torch.equal(splits.test.tensors["inputs"], same.test.tensors["inputs"])
    assert not torch.equal(splits.test.tensors["inputs"], other.test.tensors["inputs"])


def test_rt_sentences_splits_with_the_default_tokenizer() -> None:
    splits = load_splits("rt-sentences", max_length=32)
    assert (splits.task, splits.num_outputs, splits.seq_len, splits.vocab_size) == (
        "classification", 2, 32, 30522,
    )  # fmt: skip
    sizes = [len(part) for part in (splits.train, splits.validation, splits.test)]
    assert sum(sizes) == 10_605 - 37 and sizes[1] == sizes[2] == 1056
    batch = splits.train.tensors
    assert batch["input_ids"].shape == (sizes[0], 32) and batch["input_ids"].dtype == torch.long
    assert (batch["input_ids"][:, 0] == 101).all()  # [CLS]
    assert set(batch["labels"].unique().tolist()) == {0, 1}
    assert splits.info["dropped_neutral"] == 37


def test_rt_sentences_splits_are_seeded(whitespace_tokenizer: WhitespaceTokenizer) -> None:
    first = load_splits("rt-sentences", seed=0, tokenizer=whitespace_tokenizer)
    again = load_splits("rt-sentences", seed=0, tokenizer=whitespace_tokenizer)
    other = load_splits("rt-sentences", seed=1, tokenizer=whitespace_tokenizer)
    for part in ("train", "validation", "test"):
        assert torch.equal(first.info["indices"][part], again.info["indices"][part])
    assert not torch.equal(first.info["indices"]["test"], other.info["indices"]["test"])
    indices = torch.cat(list(first.info["indices"].values()))
    assert len(indices.unique()) == len(indices) == 10_568


def test_weather_split_is_chronological_without_overlap_and_uses_train_statistics() -> None:
    window = 24
    splits = load_splits("weather-hourly", window=window)
    values, columns = load_weather()
    assert (splits.task, splits.num_outputs, splits.seq_len, splits.input_dim) == (
        "regression", len(columns), window, len(columns),
    )  # fmt: skip
    ranges = splits.info["hour_ranges"]
    assert ranges == {"train": (0, 7008), "validation": (7008, 7884), "test": (7884, 8760)}
    used_hours = {}
    for part in ("train", "validation", "test"):
        targets = splits.info["target_hours"][part]
        start, stop = ranges[part]
        # Every hour a window reads (inputs and target) lies inside its own block.
        assert targets.min() - window >= start and targets.max() < stop
        used_hours[part] = set(range(int(targets.min()) - window, int(targets.max()) + 1))
        assert len(getattr(splits, part)) == stop - start - window
    assert not used_hours["train"] & used_hours["validation"]
    assert not used_hours["validation"] & used_hours["test"]
    assert not used_hours["train"] & used_hours["test"]
    mean, std = splits.info["mean"], splits.info["std"]
    assert torch.allclose(mean, values[:7008].mean(0)) and torch.allclose(std, values[:7008].std(0))
    # Un-standardizing a validation example gives back the raw hours before its target.
    example = splits.validation[5]
    hour = int(splits.info["target_hours"]["validation"][5])
    assert torch.allclose(example["inputs"] * std + mean, values[hour - window : hour], atol=1e-2)
    assert torch.allclose(example["labels"] * std + mean, values[hour], atol=1e-2)
    with pytest.raises(ValueError, match="window 0"):
        load_splits("weather-hourly", window=0)


def test_to_patches_cuts_row_major_squares() -> None:
    field = torch.arange(16 * 16).reshape(1, 16, 16)
    patches = to_patches(field, 4)
    assert patches.shape == (1, 16, 16)
    assert patches[0, 0].tolist() == field[0, :4, :4].flatten().tolist()
    assert patches[0, 1].tolist() == field[0, :4, 4:8].flatten().tolist()
    assert patches[0, 4].tolist() == field[0, 4:8, :4].flatten().tolist()


def test_darcy_splits() -> None:
    splits = load_splits("darcy-16", seed=0)
    assert (splits.task, splits.num_outputs, splits.seq_len, splits.input_dim) == (
        "regression",
        256,
        16,
        16,
    )
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [900, 100, 50]
    train = splits.train.tensors
    assert train["inputs"].shape == (900, 16, 16) and train["labels"].shape == (900, 256)
    assert (
        abs(float(train["labels"].mean())) < 1e-4 and abs(float(train["labels"].std()) - 1) < 1e-3
    )
    other = load_splits("darcy-16", seed=1)
    assert not torch.equal(splits.validation.tensors["inputs"], other.validation.tensors["inputs"])
    assert torch.equal(
        load_splits("darcy-16", seed=0).validation.tensors["inputs"],
        splits.validation.tensors["inputs"],
    )


def test_options_that_do_not_apply_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\['window'\] do not apply to data source 'digits'"):
        load_splits("digits", window=3)


def test_a_model_source_has_no_splits() -> None:
    with pytest.raises(DataSourceError, match=r"'minilm-l6' is not a dataset.*digits"):
        load_splits("minilm-l6")
