"""FSDP2 parameters (DTensors): the optimizers' elementwise updates run on each rank's shard.

HORST's and HAM's updates are elementwise, so running them on the local shards of a sharded
parameter, its gradient and its state is exactly the update of the whole tensor. Only the
decisions that look at every element (is any gradient non-finite?) need the other ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None  # type: ignore[assignment, misc]

__all__ = ["agree_on_first", "is_sharded", "local"]


def local(tensor: Tensor) -> Tensor:
    """The rank's local shard (a view: in-place updates reach the DTensor), or `tensor`."""
    if DTensor is not None and isinstance(tensor, DTensor):
        return tensor.to_local()
    return tensor


def is_sharded(tensor: Tensor) -> bool:
    """True for a DTensor with a Shard placement: its ranks hold different elements."""
    if DTensor is None or not isinstance(tensor, DTensor):
        return False
    return any(placement.is_shard() for placement in tensor.placements)


def agree_on_first(index: int | None, tensors: Sequence[Tensor]) -> int | None:
    """The smallest `index` over all ranks when `tensors` hold sharded DTensors, else `index`.

    Every rank must call it with the same list (the optimizer's parameters), as FSDP2 does.
    """
    if not any(is_sharded(tensor) for tensor in tensors):
        return index
    import torch.distributed as dist

    count = len(tensors)
    value = torch.tensor([count if index is None else index], device=local(tensors[0]).device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    smallest = int(value.item())
    return None if smallest == count else smallest
