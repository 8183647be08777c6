"""Keeping pruned weights pruned: re-masking, and optimizer state at phase flips.

An optimizer step moves pruned weights: momentum carries old gradients, weight decay and
HORST's Adam stage move every entry, and a mask that is applied once does not stay applied.
So the mask is re-applied after every optimizer step (``Masks.apply``), and at the flips
between dense and compressed phases the optimizer's moments can be reset:

- ``"none"``: leave the optimizer state alone;
- ``"momentum"``: the first moment (``exp_avg`` of Adam/AdamW/HORST, ``momentum_buffer``
  of SGD);
- ``"moments"``: every moment (also ``exp_avg_sq`` and ``max_exp_avg_sq``).

and each chosen moment is either masked (its pruned entries set to zero; ``how="mask"``) or
zeroed entirely (``how="zero"``). The step counters are never touched.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim import Optimizer

from convergent.sparse.masks import Masks

RESETS = ("none", "momentum", "moments")
RESET_HOWS = ("mask", "zero")
FIRST_MOMENTS = ("exp_avg", "momentum_buffer")
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")


def check_reset(reset: str, how: str = "mask") -> None:
    """Raise a ValueError unless ``reset`` and ``how`` are known choices."""
    if reset not in RESETS:
        raise ValueError(f"reset must be one of {', '.join(RESETS)}, got {reset!r}")
    if how not in RESET_HOWS:
        raise ValueError(f"how must be one of {', '.join(RESET_HOWS)}, got {how!r}")


@torch.no_grad()
def reset_optimizer_state(
    optimizer: Optimizer,
    model: nn.Module,
    masks: Masks,
    reset: str = "momentum",
    how: str = "mask",
) -> int:
    """Reset the moments of the masked parameters in ``optimizer``'s state.

    Works for any optimizer that keeps its moments under the torch names (AdamW, Adam, SGD,
    HORST, and HAM, whose state is its base optimizer's).

    Args:
        optimizer: the optimizer over ``model``'s parameters.
        model: the (unwrapped) model, to map mask names to parameters.
        masks: which parameters, and which of their entries (for ``how="mask"``).
        reset: ``"none"``, ``"momentum"`` or ``"moments"``.
        how: ``"mask"`` zeroes the pruned entries, ``"zero"`` the whole moment.

    Returns:
        How many state tensors were changed.
    """
    check_reset(reset, how)
    if reset == "none":
        return 0
    keys = FIRST_MOMENTS + (SECOND_MOMENTS if reset == "moments" else ())
    parameters = dict(model.named_parameters())
    changed = 0
    for name, mask in masks.items():
        state = optimizer.state.get(parameters[name])
        if not state:
            continue  # no step taken yet: nothing to reset
        for key in keys:
            value = state.get(key)
            if not isinstance(value, torch.Tensor) or value.shape != mask.shape:
                continue
            if how == "zero":
                value.zero_()
            else:
                value.mul_(mask.to(device=value.device, dtype=value.dtype))
            changed += 1
    return changed
