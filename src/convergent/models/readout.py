"""Pooling shared by every readout head: one function, so all models pool the same way."""

from __future__ import annotations

from typing import Literal

import torch

Task = Literal["classification", "regression", "lm"]
Pooling = Literal["cls", "mean", "last", "token"]

TASKS: tuple[str, ...] = ("classification", "regression", "lm")
POOLINGS: tuple[str, ...] = ("cls", "mean", "last", "token")


def check_task_and_pooling(
    task: str, pooling: str, *, allowed_tasks: tuple[str, ...] = TASKS
) -> None:
    """Raise `ValueError` unless `task` and `pooling` name a supported, compatible pair.

    Args:
        task: one of `allowed_tasks`.
        pooling: "cls" (first token), "mean" (masked mean), "last" (last kept token) or
            "token" (no pooling, one output per token; regression only). Ignored for "lm",
            which always reads out every token.
        allowed_tasks: the tasks the caller supports.
    """
    if task not in allowed_tasks:
        raise ValueError(f"task={task!r} is not supported; allowed values are {allowed_tasks}.")
    if task == "lm":
        return
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r} is not supported; allowed values are {POOLINGS}.")
    if pooling == "token" and task != "regression":
        raise ValueError(
            f"pooling='token' is only allowed for task='regression', got task={task!r}; "
            "use 'cls', 'mean' or 'last'."
        )


def keep_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Turn a 0/1 (long, bool or float) attention mask into a bool mask, True = keep."""
    if attention_mask is None:
        return None
    return attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0


def pool_hidden_state(
    hidden_state: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str
) -> torch.Tensor:
    """Pool a `[B, T, D]` representation into `[B, D]` (or keep `[B, T, D]` for "token").

    Args:
        hidden_state: `[B, T, D]`.
        attention_mask: `[B, T]`, 1 = real token, 0 = padding; `None` means all real.
        pooling: "cls" takes position 0, "mean" averages the kept positions, "last" takes the
            last kept position (right padding assumed), "token" returns the input unchanged.

    Returns:
        `[B, D]`, or `[B, T, D]` for "token".
    """
    if pooling == "token":
        return hidden_state
    if pooling == "cls":
        return hidden_state[:, 0]
    mask = keep_mask(attention_mask)
    if pooling == "mean":
        if mask is None:
            return hidden_state.mean(dim=1)
        weights = mask.to(hidden_state.dtype).unsqueeze(-1)
        # clamp: an all-padding row pools to zeros instead of NaN.
        return (hidden_state * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    if pooling == "last":
        if mask is None:
            return hidden_state[:, -1]
        last = (mask.long().sum(dim=1) - 1).clamp(min=0)
        return hidden_state[torch.arange(hidden_state.shape[0], device=hidden_state.device), last]
    raise ValueError(f"pooling={pooling!r} is not supported; allowed values are {POOLINGS}.")
