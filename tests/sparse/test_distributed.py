"""AC/DC under torchrun with 2 gloo processes: identical masks on every rank."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import assert_batches_split
from tests.launch import torchrun


@pytest.mark.distributed
def test_two_ranks_hold_identical_masks(tmp_path):
    output = tmp_path / "result"
    torchrun("tests.sparse.ddp_worker", str(output), "2", processes=2)
    ranks = [torch.load(f"{output}.rank{rank}", weights_only=True) for rank in (0, 1)]
    torchrun("tests.sparse.ddp_worker", str(tmp_path / "single"), "1", processes=1)
    single = torch.load(tmp_path / "single.rank0", weights_only=True)
    assert_batches_split(single["train_served"], [r["train_served"] for r in ranks], local=8)
    # the same global batches: one process ends where two do
    for name, mask in single["masks"].items():
        assert torch.equal(mask, ranks[0]["masks"][name]), name
    assert ranks[0]["compressions"] == ranks[1]["compressions"] > 1
    assert list(ranks[0]["masks"]) == list(ranks[1]["masks"])
    total = kept = 0
    for name, mask in ranks[0]["masks"].items():
        assert torch.equal(mask, ranks[1]["masks"][name]), name
        for rank in ranks:
            assert (rank["state"][name][~mask] == 0).all()
        total, kept = total + mask.numel(), kept + int(mask.sum())
    assert total - kept == round(0.75 * total)
    for name, value in ranks[0]["state"].items():
        torch.testing.assert_close(ranks[1]["state"][name], value, rtol=0, atol=0)
