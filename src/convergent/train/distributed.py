"""Thin helpers over ``torch.distributed`` for runs launched with ``torchrun``.

We never write our own distributed layer: these functions only read the environment that
``torchrun`` sets, start the default process group and wrap models in
``DistributedDataParallel``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def is_distributed() -> bool:
    """Whether a default process group is running with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank, 0 outside a process group."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """Number of processes, 1 outside a process group."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """True on rank 0: the process that logs, writes checkpoints and draws progress bars."""
    return rank() == 0


def init_from_environment(backend: str | None = None) -> bool:
    """Start the default process group when launched by ``torchrun``.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; by default nccl when CUDA is available, else gloo.

    Returns:
        True when a process group is (now) running, False for a plain single-process run.
    """
    if dist.is_initialized():
        return True
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return True


def barrier() -> None:
    """Wait until every rank gets here; a no-op outside a process group."""
    if is_distributed():
        dist.barrier()


def shutdown() -> None:
    """End the default process group, if one is running; a no-op otherwise.

    Every rank first waits at a barrier, so that no rank tears down its gloo connections
    while a peer is still using them (which aborts the peer with "terminate called
    without an active exception").
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    barrier()
    dist.destroy_process_group()


def wrap_model(model: nn.Module) -> nn.Module:
    """Wrap ``model`` in ``DistributedDataParallel`` when a process group is running."""
    if not is_distributed():
        return model
    device_ids = [model_device(model).index] if model_device(model).type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a parameterless model)."""
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average ``tensor`` over all processes (a copy; the input is left untouched)."""
    if not is_distributed():
        return tensor.clone()
    reduced = tensor.detach().clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced / world_size()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all processes (a copy; the input is left untouched)."""
    reduced = tensor.detach().clone()
    if is_distributed():
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced


def any_rank(flag: bool, device: torch.device | None = None) -> bool:
    """Whether ``flag`` is True on any process (one small all-reduce under DDP), so that every
    rank takes the same branch; ``device`` holds the reduced tensor (the model's, for NCCL)."""
    if not is_distributed():
        return bool(flag)
    value = torch.tensor(float(flag), device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
