"""FSDP2 parameters (DTensors): the optimizers' elementwise updates run on each rank's shard.

HORST's and HAM's updates are elementwise, so running them on the local shards of a sharded
parameter, its gradient and its state is exactly the update of the whole tensor. Only the
decisions that look at every element (is any gradient non-finite?) need the other ranks; they
are taken together whenever a process group runs, so DDP replicas agree too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["agree_on_first", "is_dtensor", "is_sharded", "local"]


def is_dtensor(tensor: Tensor) -> bool:
    """True for a DTensor (an FSDP2 parameter, its gradient or state).

    ``torch.distributed.tensor`` is not imported for the question (a second of CPU in every
    fresh process): a DTensor exists only once that module has been imported to make it.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local(tensor: Tensor) -> Tensor:
    """The rank's local shard (a view: in-place updates reach the DTensor), or `tensor`."""
    if is_dtensor(tensor):
        return tensor.to_local()  # type: ignore[attr-defined]
    return tensor


def is_sharded(tensor: Tensor) -> bool:
    """True for a DTensor with a Shard placement: its ranks hold different elements."""
    if not is_dtensor(tensor):
        return False
    return any(placement.is_shard() for placement in tensor.placements)  # type: ignore[attr-defined]


def agree_on_first(index: int | None, tensors: Sequence[Tensor]) -> int | None:
    """The smallest `index` over all ranks when a process group of several ranks runs, else
    `index`.

    Sharded (FSDP2) ranks see different elements, and replicated (DDP) ranks can see different
    gradients (a rank-local NaN that no all-reduce has spread), so under a process group every
    rank asks the others. Every rank must call it, each with its list of the optimizer's
    gradients, as DDP and FSDP2 training steps do.
    """
    import torch.distributed as dist

    running = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not running:
        return index
    value = torch.tensor([_NONE if index is None else index], device=_device(tensors))
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    smallest = int(value.item())
    return None if smallest == _NONE else smallest


# "No index" in the reduction: larger than any list of tensors.
_NONE = 2**62


def _device(tensors: Sequence[Tensor]) -> torch.device:
    """Where the reduction runs: with the tensors, or where the backend can reduce."""
    if tensors:
        return local(tensors[0]).device
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
