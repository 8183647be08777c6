"""Mirror maps and the mirror step M.

A mirror step moves a parameter in the dual coordinates of a strictly convex potential psi:

    theta_next = grad_psi_star(grad_psi(theta) - direction)

With the Euclidean potential psi(x) = x^2 / 2 this is a plain gradient step. With the
hyperbolic entropy of scale gamma (Ghai, Hazan and Singer, 2020),

    psi(x) = x * asinh(x / gamma) - sqrt(x^2 + gamma^2),
    grad_psi(x) = asinh(x / gamma),  grad_psi_star(y) = gamma * sinh(y),

the step is additive for |theta| << gamma and multiplicative for |theta| >> gamma, which
biases the iterates towards sparse (small L1) solutions. As gamma -> 0 the step becomes

    theta_next = theta * exp(-sign(theta) * direction),

which never changes the sign of theta: the mirror step of HORST (Jacobs, Jain and Burkholz,
"HORST: Composing Optimizer Geometries for Sparse Transformer Training", 2026).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["EuclideanMap", "HyperbolicEntropyMap", "MirrorMap", "mirror_step"]


class MirrorMap:
    """A mirror map: the gradient of a potential psi and the gradient of its convex conjugate.

    Subclasses implement `grad_psi` and `grad_psi_star`; `step` composes them and may be
    overridden by a closed form that is numerically better or defined in a limit.
    """

    def grad_psi(self, theta: Tensor) -> Tensor:
        """Maps primal coordinates to dual coordinates."""
        raise NotImplementedError

    def grad_psi_star(self, dual: Tensor) -> Tensor:
        """Maps dual coordinates back to primal coordinates (the inverse of `grad_psi`)."""
        raise NotImplementedError

    def step(self, theta: Tensor, direction: Tensor) -> Tensor:
        """Returns grad_psi_star(grad_psi(theta) - direction)."""
        return self.grad_psi_star(self.grad_psi(theta) - direction)


class EuclideanMap(MirrorMap):
    """psi(x) = x^2 / 2: the mirror step is the plain step theta - direction."""

    def grad_psi(self, theta: Tensor) -> Tensor:
        return theta

    def grad_psi_star(self, dual: Tensor) -> Tensor:
        return dual

    def step(self, theta: Tensor, direction: Tensor) -> Tensor:
        return theta - direction

    def __repr__(self) -> str:
        return "EuclideanMap()"


class HyperbolicEntropyMap(MirrorMap):
    """The hyperbolic entropy of scale gamma: grad_psi(x) = asinh(x / gamma).

    Args:
        scale: gamma >= 0. Small scales give a strong bias towards sparse solutions.
            `scale=0` is the multiplicative limit theta * exp(-sign(theta) * direction) used
            by HORST; its dual coordinates are infinite, so only `step` is defined there.
    """

    def __init__(self, scale: float = 0.0) -> None:
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ValueError(f"scale must be a finite number >= 0, got {scale!r}.")
        self.scale = float(scale)

    def _require_positive_scale(self) -> None:
        if self.scale == 0:
            raise ValueError(
                "HyperbolicEntropyMap(scale=0) has no finite dual coordinates; "
                "use step(), or a scale > 0."
            )

    def grad_psi(self, theta: Tensor) -> Tensor:
        self._require_positive_scale()
        return torch.asinh(theta / self.scale)

    def grad_psi_star(self, dual: Tensor) -> Tensor:
        self._require_positive_scale()
        return self.scale * torch.sinh(dual)

    def step(self, theta: Tensor, direction: Tensor) -> Tensor:
        if self.scale == 0:
            exponent = torch.sign(theta) * direction
            # theta * exp(-exponent), in the one new buffer (bit for bit: the same kernels on
            # the same tensors, and a product is the same either way round).
            return (
                exponent.neg_().exp_().mul_(theta)
                if fits_in_place(exponent, theta)
                else (theta * torch.exp(-exponent))
            )
        return super().step(theta, direction)

    def __repr__(self) -> str:
        return f"HyperbolicEntropyMap(scale={self.scale!r})"


def fits_in_place(result: Tensor, other: Tensor) -> bool:
    """Whether ``result`` can take an in-place op with ``other`` and give what the op would
    give out of place: the same dtype, and ``other`` broadcasts to ``result``'s shape."""
    return result.dtype == other.dtype and torch.broadcast_shapes(result.shape, other.shape) == (
        result.shape
    )


def mirror_step(theta: Tensor, direction: Tensor, mirror_map: MirrorMap) -> Tensor:
    """The mirror step M: theta_next = grad_psi_star(grad_psi(theta) - direction).

    Args:
        theta: the point to move from.
        direction: the step in dual coordinates (a gradient times a step size).
        mirror_map: the geometry, for example `HyperbolicEntropyMap(scale)`.

    Returns:
        The new point, a new tensor.
    """
    return mirror_map.step(theta, direction)
