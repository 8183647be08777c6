"""The Langevin optimizer's noise streams: the generators' keys (device, shard of a rank,
stream), the threads that draw the streams side by side, and the draw itself.

A key names where a generator's numbers go, so that a saved optimizer restores each
generator to the tensors it drew for: ``cuda:0``, ``cpu#shard-of-rank-1``, ``cpu#stream-3``.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

SHARD_MARK = "#shard-of-rank-"
STREAM_MARK = "#stream-"


def draw_normal(pieces: list[tuple[Tensor, torch.Generator]]) -> None:
    """Fill each piece with standard normal numbers from its own generator."""
    for piece, generator in pieces:
        piece.normal_(generator=generator)


@functools.cache
def noise_pool(streams: int) -> ThreadPoolExecutor:
    """One thread per noise stream, shared by every optimizer (a pool is not state: it is
    neither saved nor copied with an optimizer)."""
    return ThreadPoolExecutor(max_workers=streams, thread_name_prefix="convergent-noise")


# A forked child (a DataLoader worker, a process pool) has none of the parent's threads: it
# must build its own pools rather than wait on threads that do not exist.
os.register_at_fork(after_in_child=noise_pool.cache_clear)


def process_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def device_key(device: torch.device | str) -> str:
    """ "cpu", "cuda:0", ...: an accelerator without an index means its current one."""
    device = torch.device(device)
    if device.type != "cpu" and device.index is None:
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "current_device"):
            device = torch.device(device.type, module.current_device())
    return str(device)
