"""The module inside a wrapper: DDP, DataParallel or ``torch.compile``."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["unwrap_model"]


def unwrap_model(model: nn.Module) -> Any:
    """The module inside DDP, DataParallel or compiled wrappers (nested ones too), or
    ``model`` itself. FSDP2 (``fully_shard``) shards in place and needs no unwrapping."""
    inner: Any = model
    while True:
        if isinstance(inner, nn.parallel.DistributedDataParallel | nn.DataParallel):
            inner = inner.module
        elif isinstance(getattr(inner, "_orig_mod", None), nn.Module):
            inner = inner._orig_mod
        else:
            return inner
