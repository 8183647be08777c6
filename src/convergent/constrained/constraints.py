"""Layer-wise descent constraints: each layer must lower the loss of the one before it.

With per-layer losses f_0 .. f_L (f_0 at the embedding output, f_L at the last layer) and
a step-size schedule alpha_1 .. alpha_L in [0, 1), the constraints are

    s_l = f_l - (1 - alpha_l) f_{l-1} <= 0,   l = 1..L,

from "A Constrained Optimization Perspective of Unrolled Transformers" (Porras-Valenzuela,
Hadou, Ribeiro, 2026). ``s_l`` is the slack (positive = violated).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

AlphaSpec = float | Sequence[float] | Callable[[int], float]


def check_layer_losses(losses: torch.Tensor, num_constraints: int) -> torch.Tensor:
    """Raise unless ``losses`` holds L + 1 finite values for ``num_constraints`` = L.

    Args:
        losses: per-layer losses ``[f_0, .., f_L]``, a 1-d tensor.
        num_constraints: L, the number of descent constraints.

    Returns:
        ``losses`` unchanged.
    """
    if losses.ndim != 1 or losses.shape[0] != num_constraints + 1:
        raise ValueError(
            f"per-layer losses have shape {tuple(losses.shape)}; expected ({num_constraints + 1},)"
            f" (f_0 .. f_L for {num_constraints} constraints)"
        )
    finite = torch.isfinite(losses.detach())
    if not bool(finite.all()):
        layer = int((~finite).nonzero()[0, 0])
        raise FloatingPointError(
            f"the loss at layer {layer} is {float(losses[layer].detach())}; "
            "per-layer losses must be finite"
        )
    return losses


def resolve_alpha(alpha: AlphaSpec, num_constraints: int) -> torch.Tensor:
    """Turn a constant, a per-layer sequence or a schedule ``alpha(l)`` into L values.

    Args:
        alpha: one value for every layer; L values (layer 1 first); or a callable taking the
            layer index l = 1..L and returning alpha_l.
        num_constraints: L.

    Returns:
        float64 tensor ``[alpha_1 .. alpha_L]``, every entry in [0, 1).
    """
    if num_constraints < 1:
        raise ValueError(f"num_constraints must be a positive integer, got {num_constraints}")
    if callable(alpha):
        values = [float(alpha(layer)) for layer in range(1, num_constraints + 1)]
    elif isinstance(alpha, int | float):
        values = [float(alpha)] * num_constraints
    else:
        values = [float(a) for a in alpha]
        if len(values) != num_constraints:
            raise ValueError(
                f"alpha has {len(values)} values; expected one per constraint ({num_constraints})"
            )
    for layer, value in enumerate(values, start=1):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"alpha for layer {layer} is {value}; it must be in [0, 1)")
    return torch.tensor(values, dtype=torch.float64)


def descent_slacks(
    losses: torch.Tensor, alpha: torch.Tensor, detach_previous: bool = False
) -> torch.Tensor:
    """Slacks s_l = f_l - (1 - alpha_l) f_{l-1}, l = 1..L (positive means violated).

    Args:
        losses: ``[f_0 .. f_L]``.
        alpha: ``[alpha_1 .. alpha_L]``.
        detach_previous: stop gradients through the right-hand side (1 - alpha_l) f_{l-1}, so
            that a constraint pushes layer l down without pulling layer l - 1 up.
    """
    previous = losses[:-1].detach() if detach_previous else losses[:-1]
    return losses[1:] - (1.0 - alpha.to(losses.dtype)) * previous


class DescentConstraints(nn.Module):
    """The L named constraints f_l <= (1 - alpha_l) f_{l-1}, with alpha kept as a buffer.

    Args:
        num_layers: L, the number of layers (= constraints).
        alpha: a constant, L values, or a callable ``alpha(l)`` for l = 1..L; each in [0, 1).
        detach_previous: stop gradients through the right-hand side of each constraint.

    Example:
        >>> constraints = DescentConstraints(3, alpha=0.1)
        >>> constraints(torch.tensor([1.0, 0.8, 0.9, 0.5]))
        tensor([-0.1000,  0.1800, -0.3100])
    """

    alpha: torch.Tensor

    def __init__(
        self, num_layers: int, alpha: AlphaSpec = 0.0, *, detach_previous: bool = False
    ) -> None:
        super().__init__()
        self.num_constraints = num_layers
        self.detach_previous = detach_previous
        self.register_buffer("alpha", resolve_alpha(alpha, num_layers).float())

    @property
    def names(self) -> list[str]:
        """One name per constraint, ``descent_1`` .. ``descent_L``."""
        return [f"descent_{layer}" for layer in range(1, self.num_constraints + 1)]

    def set_alpha(self, alpha: AlphaSpec) -> None:
        """Replace alpha (e.g. to tighten the constraints during training)."""
        self.alpha.copy_(resolve_alpha(alpha, self.num_constraints))

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        """Slacks ``[s_1 .. s_L]`` of the per-layer losses ``[f_0 .. f_L]``."""
        check_layer_losses(losses, self.num_constraints)
        return descent_slacks(losses, self.alpha, self.detach_previous)

    def satisfied(self, losses: torch.Tensor) -> torch.Tensor:
        """Bool ``[L]``: which constraints hold for ``losses``."""
        with torch.no_grad():
            return self.forward(losses) <= 0

    def extra_repr(self) -> str:
        return f"num_constraints={self.num_constraints}, detach_previous={self.detach_previous}"
