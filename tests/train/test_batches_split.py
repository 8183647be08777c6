"""iterate_batches in one process: the order, epochs, resumption and the rank/world split.

The expected order is written here from the documented rule: epoch ``e`` of seed ``s`` is
``torch.randperm(n)`` under ``manual_seed(s * 1_000_003 + e)``; its ``n // B`` full global
batches are consecutive slices (the ragged tail is dropped), and rank ``r`` of ``w`` takes
the ``r``-th of ``w`` equal slices of each. The formula is pinned on purpose: a checkpoint
resumed under a different formula would silently train on different batches.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from convergent.train.batches import iterate_batches
from tests.conftest import RecordingDataset, TensorDataset


def expected_global_batches(size: int, batch_size: int, seed: int, epochs: int) -> list[list[int]]:
    batches = []
    for epoch in range(epochs):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(size, generator=generator).tolist()
        batches += [order[i * batch_size : (i + 1) * batch_size] for i in range(size // batch_size)]
    return batches


def indexed(size: int) -> TensorDataset:
    """Each example carries its own index, and a per-example feature derived from it."""
    index = torch.arange(size)
    return TensorDataset(index=index, features=torch.stack([index * 2.0, index * 3.0], dim=1))


def take_steps(stream, steps: int) -> list[list[int]]:
    return [batch["index"].tolist() for batch in itertools.islice(stream, steps)]


@pytest.mark.parametrize("seed", [0, 1, 17])
def test_one_process_sees_the_seeded_order_epoch_after_epoch_without_the_ragged_tail(seed):
    size, batch_size = 23, 5  # 4 full batches per epoch, 3 examples dropped each epoch
    got = take_steps(iterate_batches(indexed(size), batch_size, seed=seed), 4 * 3 + 2)
    assert got == expected_global_batches(size, batch_size, seed, epochs=4)[:14]
    for epoch in range(3):
        seen = [i for batch in got[4 * epoch : 4 * epoch + 4] for i in batch]
        assert len(set(seen)) == 20  # no example twice within an epoch
    assert got[:4] != got[4:8]  # every epoch is reshuffled


def test_seeds_give_different_orders_and_the_same_seed_the_same_order():
    data = indexed(40)
    first = take_steps(iterate_batches(data, 8, seed=3), 10)
    torch.manual_seed(12345)  # the global random state plays no part
    again = take_steps(iterate_batches(data, 8, seed=3), 10)
    other = take_steps(iterate_batches(data, 8, seed=4), 10)
    assert first == again and first != other


def test_iterating_leaves_the_global_random_stream_alone():
    torch.manual_seed(5)
    untouched = torch.rand(3)
    torch.manual_seed(5)
    take_steps(iterate_batches(indexed(30), 6, seed=2), 12)
    assert torch.equal(torch.rand(3), untouched)


@pytest.mark.parametrize("start_step", [0, 1, 3, 4, 5, 9, 13])
def test_resuming_at_any_step_continues_the_uninterrupted_stream(start_step):
    size, batch_size, seed = 23, 5, 6
    expected = expected_global_batches(size, batch_size, seed, epochs=6)
    got = take_steps(
        iterate_batches(indexed(size), batch_size, seed=seed, start_step=start_step), 7
    )
    assert got == expected[start_step : start_step + 7]


def test_the_defaults_are_step_zero_rank_zero_of_one_on_the_cpu():
    data = indexed(24)
    default = list(itertools.islice(iterate_batches(data, 6, seed=9), 6))
    explicit = iterate_batches(data, 6, seed=9, start_step=0, rank=0, world_size=1, device="cpu")
    assert [b["index"].tolist() for b in default] == take_steps(explicit, 6)
    assert [b["index"].tolist() for b in default] == expected_global_batches(24, 6, 9, 2)[:6]
    assert all(value.device.type == "cpu" for b in default for value in b.values())


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 12])
def test_each_rank_takes_its_slice_of_every_global_batch(world_size):
    size, batch_size, seed = 50, 12, 8  # 4 full batches per epoch
    local = batch_size // world_size
    expected = expected_global_batches(size, batch_size, seed, epochs=3)
    streams = [
        iterate_batches(indexed(size), batch_size, seed=seed, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    per_rank = [take_steps(stream, 10) for stream in streams]  # crosses two epoch boundaries
    for step in range(10):
        for rank in range(world_size):
            part = per_rank[rank][step]
            assert part == expected[step][rank * local : (rank + 1) * local], (step, rank)
        union = [i for rank in range(world_size) for i in per_rank[rank][step]]
        assert union == expected[step]  # disjoint parts whose union is the global batch


def test_a_resumed_rank_takes_its_slice_from_the_resumed_step():
    expected = expected_global_batches(50, 12, 8, epochs=3)
    stream = iterate_batches(indexed(50), 12, seed=8, start_step=6, rank=2, world_size=3)
    assert take_steps(stream, 4) == [batch[8:12] for batch in expected[6:10]]


def test_examples_are_gathered_whole_from_any_dataset_and_moved_to_the_device():
    data = indexed(20)
    recording = RecordingDataset(data)  # no `tensors`: read example by example
    batches = list(itertools.islice(iterate_batches(recording, 4, seed=1, device="meta"), 3))
    expected = expected_global_batches(20, 4, 1, epochs=1)[:3]
    assert recording.served == [i for batch in expected for i in batch]
    for batch in batches:
        assert set(batch) == {"index", "features"}
        assert all(value.device.type == "meta" for value in batch.values())
        assert batch["features"].shape == (4, 2)
    on_cpu = next(iterate_batches(data, 4, seed=1))
    rows = torch.tensor(expected[0])
    assert torch.equal(on_cpu["features"], torch.stack([rows * 2.0, rows * 3.0], dim=1))


def test_padding_past_the_longest_example_is_trimmed_per_batch():
    lengths = torch.tensor([2, 3, 1, 2, 5, 1, 2, 3])
    mask = (torch.arange(6) < lengths[:, None]).long()
    data = TensorDataset(
        index=torch.arange(8), input_ids=torch.arange(48).reshape(8, 6), attention_mask=mask
    )
    for batch in itertools.islice(iterate_batches(data, 4, seed=0), 4):
        longest = int(lengths[batch["index"]].max())
        assert batch["input_ids"].shape == (4, longest)
        assert torch.equal(batch["input_ids"], data.tensors["input_ids"][batch["index"], :longest])


def test_a_batch_that_does_not_split_evenly_or_exceeds_the_data_is_refused():
    data = indexed(30)
    message = "batch_size (10) must be divisible by the number of processes (3)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        next(iterate_batches(data, 10, seed=0, world_size=3))
    message = "batch_size (32) must not exceed the number of training examples (30)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        next(iterate_batches(data, 32, seed=0))
