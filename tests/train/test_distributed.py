from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.launch import torchrun


def _run(tmp_path: Path, processes: int) -> dict:
    output = tmp_path / f"result-{processes}.pt"
    torchrun("tests.train.ddp_worker", str(output), processes=processes)
    return torch.load(output, weights_only=True)


@pytest.mark.distributed
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path):
    one = _run(tmp_path, 1)
    two = _run(tmp_path, 2)
    for name, value in one["state"].items():
        torch.testing.assert_close(two["state"][name], value, rtol=1e-5, atol=1e-6)
    assert one["evaluation"]["accuracy"] == pytest.approx(two["evaluation"]["accuracy"])
    assert one["evaluation"]["loss"] == pytest.approx(two["evaluation"]["loss"], rel=1e-5)
