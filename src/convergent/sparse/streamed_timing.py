"""Timing a layer as a model runs it: its weights streamed from memory, not cache-hot.

A model whose pruned layers hold more bytes than the last-level cache reads every weight
from memory on every forward, so a layer timed alone, call after call on the same weights,
is timed from the cache instead: there a dense GEMV runs several times faster than in the
model, and a sparse kernel's saving in bytes does not show. Measured here (a 2816 x 1024
float32 layer at 70 %, one token, one thread, the weights in L3): dense 550 us a call, far
from memory bound; so to_sparse_kernels left every layer of a d_model 1024 model dense.

So each candidate is timed over copies of itself that together hold ``STREAM_FACTOR`` times
the last-level cache, called in turn (:class:`Rotation`): each call finds its weights
evicted by the copies called since.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STREAM_FACTOR = 2
MAX_COPIES = 64
DEFAULT_CACHE_BYTES = 32 * 2**20
_CACHE_SIZE = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")


def last_level_cache_bytes() -> int:
    """The CPU's L3 size (Linux sysfs), else ``DEFAULT_CACHE_BYTES``."""
    try:
        text = _CACHE_SIZE.read_text().strip()
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
    except (OSError, ValueError, IndexError):
        return DEFAULT_CACHE_BYTES


def copies_to_stream(layer_bytes: int, model_bytes: int, cache_bytes: int | None = None) -> int:
    """How many copies of a layer of ``layer_bytes`` to time in turn: 1 (cache-hot, as the
    model runs it) when all the candidate layers, ``model_bytes``, fit in the cache; else
    enough to hold ``STREAM_FACTOR`` caches, at most ``MAX_COPIES``."""
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    if model_bytes <= cache or layer_bytes <= 0:
        return 1
    return max(1, min(MAX_COPIES, math.ceil(STREAM_FACTOR * cache / layer_bytes)))


class Rotation:
    """A call that runs the next of ``modules`` on ``inputs`` each time (a timer's call).

    Attributes:
        layout: the modules' layout (``"dense"`` for the dense layer), for reports and tests.
    """

    def __init__(self, modules: Sequence[Callable[[Any], Any]], inputs: Any, layout: str) -> None:
        self.modules = list(modules)
        self.inputs = inputs
        self.layout = layout
        self.index = 0

    def __call__(self) -> Any:
        module = self.modules[self.index]
        self.index = (self.index + 1) % len(self.modules)
        return module(self.inputs)
