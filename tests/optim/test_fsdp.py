"""The optimizers on FSDP2-sharded parameters: 2 gloo ranks against an unsharded copy."""

from __future__ import annotations

import pytest

from tests.launch import torchrun


@pytest.mark.distributed
def test_optimizers_on_fsdp2_shards_match_one_process():
    # HORST (foreach, compiled), HAM (compiled, foreach) and Langevin at s = 0 equal the
    # unsharded run; for HORST, HAM and Langevin, a NaN in one rank's shard (or in one
    # replica's gradient) makes every rank skip, and with nonfinite="raise" every rank raises
    # naming the same parameter; Langevin's shards draw independent noise of variance lr * s
    # (within 3 %) and the state dict keeps each rank's stream; under DDP, Langevin with s > 0
    # keeps the replicas identical. See fsdp_worker.py.
    torchrun("tests.optim.fsdp_worker", processes=2)
