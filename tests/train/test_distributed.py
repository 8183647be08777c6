from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import assert_batches_split, assert_examples_split
from tests.launch import torchrun


def _run(tmp_path: Path, processes: int) -> list[dict]:
    output = tmp_path / f"result-{processes}.pt"
    torchrun("tests.train.ddp_worker", str(output), str(processes), processes=processes)
    return [torch.load(f"{output}.rank{rank}", weights_only=True) for rank in range(processes)]


@pytest.mark.distributed
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path):
    (one,) = _run(tmp_path, 1)
    ranks = _run(tmp_path, 2)
    two = ranks[0]
    # each rank trains on its half of every global batch and evaluates its share of the set
    assert_batches_split(one["train_served"], [r["train_served"] for r in ranks], local=8)
    assert_examples_split([r["eval_served"] for r in ranks], 601)
    assert sorted(one["eval_served"]) == list(range(601))
    for name, value in ranks[1]["state"].items():
        torch.testing.assert_close(value, two["state"][name], rtol=0, atol=0)
    for name, value in one["state"].items():
        torch.testing.assert_close(two["state"][name], value, rtol=1e-5, atol=1e-6)
    assert one["evaluation"]["accuracy"] == pytest.approx(two["evaluation"]["accuracy"])
    assert one["evaluation"]["loss"] == pytest.approx(two["evaluation"]["loss"], rel=1e-5)


def test_shutdown_ends_a_running_group_and_is_a_no_op_without_one(tmp_path):
    import torch.distributed as dist

    from convergent.train import distributed

    distributed.shutdown()  # no group: nothing to do, nothing raised
    assert not dist.is_initialized()
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    assert dist.is_initialized()
    distributed.shutdown()
    assert not dist.is_initialized()
