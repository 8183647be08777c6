"""Batches: trimming the all-padding tail, and gathering examples from any dataset."""

from __future__ import annotations

import pytest
import torch

from convergent.train.batches import batches_per_epoch, take, trim_padding
from tests.conftest import RecordingDataset, TensorDataset


def test_trim_padding_cuts_the_columns_past_the_longest_mask():
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    batch = {
        "input_ids": torch.arange(12).reshape(2, 6),
        "attention_mask": mask,
        "labels": torch.tensor([0, 1]),  # per example: not cut
        "token_labels": torch.arange(12).reshape(2, 6) * 10,  # per token: cut
    }
    trimmed = trim_padding(batch)
    assert trimmed["input_ids"].tolist() == [[0, 1, 2], [6, 7, 8]]
    assert trimmed["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert trimmed["token_labels"].tolist() == [[0, 10, 20], [60, 70, 80]]
    assert trimmed["labels"].tolist() == [0, 1]


def test_trim_padding_leaves_full_masks_missing_masks_and_empty_rows_alone():
    full = {"input_ids": torch.ones(2, 4), "attention_mask": torch.ones(2, 4)}
    assert trim_padding(full)["input_ids"].shape == (2, 4)
    no_mask = {"inputs": torch.ones(2, 4, 3)}
    assert trim_padding(no_mask)["inputs"].shape == (2, 4, 3)
    empty = {"input_ids": torch.ones(2, 4), "attention_mask": torch.zeros(2, 4)}
    assert trim_padding(empty)["input_ids"].shape == (2, 1)  # never zero columns
    three_d = {"x": torch.ones(2, 4), "attention_mask": torch.zeros(2, 4, 4)}
    assert trim_padding(three_d)["x"].shape == (2, 4)  # only a [B, T] mask trims


def test_take_reads_tensor_datasets_directly_and_others_by_example():
    data = TensorDataset(inputs=torch.arange(20.0).reshape(10, 2), labels=torch.arange(10))
    indices = torch.tensor([7, 2, 5])
    direct = take(data, indices)
    recording = RecordingDataset(data)
    collated = take(recording, indices)
    assert recording.served == [7, 2, 5]
    for key in ("inputs", "labels"):
        assert torch.equal(direct[key], data.tensors[key][indices])
        assert torch.equal(collated[key], direct[key])


def test_batches_per_epoch_drops_the_last_partial_batch():
    assert batches_per_epoch(70, 16) == 4
    assert batches_per_epoch(64, 16) == 4
    with pytest.raises(ValueError, match="must not exceed the number of training examples"):
        batches_per_epoch(8, 16)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        batches_per_epoch(8, 0)
