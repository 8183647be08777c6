"""Learning-rate schedules as ``torch.optim.lr_scheduler.LambdaLR`` factories."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("constant", "linear", "cosine")


def warmup_schedule(
    optimizer: Optimizer, total_steps: int, warmup_steps: int = 0, kind: str = "cosine"
) -> LambdaLR:
    """Linear warm-up to each group's lr, then constant, linear or cosine decay to zero.

    Args:
        optimizer: any torch optimizer.
        total_steps: the length of training in optimizer steps (> 0).
        warmup_steps: steps of linear warm-up, in [0, total_steps].
        kind: ``"constant"``, ``"linear"`` or ``"cosine"``.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {kind!r}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be a positive integer, got {total_steps}")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps must be in [0, {total_steps}], got {warmup_steps}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        progress = min(progress, 1.0)
        if kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
