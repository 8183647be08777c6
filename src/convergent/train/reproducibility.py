"""Seeding and random-number-generator state that round-trips through a checkpoint."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA).

    Args:
        seed: the seed; must be a non-negative integer.
        deterministic: also ask torch for deterministic kernels (slower on GPU).
    """
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def rng_state() -> dict[str, Any]:
    """Every global RNG state, in types that ``torch.load(weights_only=True)`` accepts."""
    numpy_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np.asarray(numpy_state[1], dtype=np.int64)),
            "position": int(numpy_state[2]),
            "has_gauss": int(numpy_state[3]),
            "cached_gaussian": float(numpy_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    python_state = state["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
