"""Villani's condition, measured: ||grad V||^2 / s - Laplacian V along a ray.

Langevin dynamics dT = -grad V(T) dt + sqrt(s) dB is ergodic, with stationary density
proportional to exp(-2 V / s), when Villani's quantity

    ||grad V(T)||^2 / s - Laplacian V(T)  ->  infinity   as ||T|| -> infinity.

`villani_quantity` estimates it at one point, the Laplacian by Hutchinson's estimator
(trace(H) = E[z^T H z] for Rademacher z); `villani_along_ray` repeats it at growing radii, and
`flat_potential` turns an objective over named tensors (a model's W_Q, W_K, say) into the
function of one flat vector that both expect. A loss that is flat at infinity (attention's
loss in W_Q, W_K once the softmax saturates) fails the condition; adding a Villani penalty
(`convergent.regularize`) restores it (Frangi et al., 2026).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def villani_quantity(
    potential: Callable[[Tensor], Tensor],
    point: Tensor,
    s: float,
    probes: int = 16,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """||grad V||^2 / s - Laplacian V at `point`, the Laplacian by Hutchinson's estimator.

    Laplacian V = trace(H) = E[z^T H z] for Rademacher z; each probe costs one Hessian-vector
    product (a second backward pass), so `potential` must be twice differentiable.

    Args:
        potential: V, mapping a flat vector to a scalar tensor.
        point: where to evaluate, a 1-D tensor.
        s: the diffusion coefficient, > 0.
        probes: number of Hutchinson probes, >= 1.
        generator: for the probes.

    Returns:
        {"villani", "gradient_norm_squared", "laplacian", "laplacian_stderr", "potential"}.
    """
    if not (isinstance(s, (int, float)) and s > 0 and math.isfinite(s)):
        raise ValueError(f"s must be a finite number > 0, got {s!r}.")
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
        raise ValueError(f"probes must be an integer >= 1, got {probes!r}.")
    x = point.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        value = potential(x)
        (gradient,) = torch.autograd.grad(value, x, create_graph=True)
        estimates = []
        for index in range(probes):
            bits = torch.randint(0, 2, x.shape, generator=generator, device=x.device)
            z = bits.to(x.dtype) * 2 - 1
            (hessian_z,) = torch.autograd.grad(
                gradient, x, grad_outputs=z, retain_graph=index < probes - 1
            )
            estimates.append((z * hessian_z).sum().detach())
    laplacian = torch.stack(estimates)
    gradient_norm_squared = float(gradient.detach().pow(2).sum())
    mean = float(laplacian.mean())
    stderr = float(laplacian.std() / math.sqrt(probes)) if probes > 1 else math.nan
    return {
        "villani": gradient_norm_squared / s - mean,
        "gradient_norm_squared": gradient_norm_squared,
        "laplacian": mean,
        "laplacian_stderr": stderr,
        "potential": float(value.detach()),
    }


def flat_potential(
    objective: Callable[[dict[str, Tensor]], Tensor], shapes: dict[str, torch.Size]
) -> Callable[[Tensor], Tensor]:
    """V over one flat vector, from an objective over named tensors (for `villani_quantity`).

    Example (V over W_Q and W_K of a model, with `torch.func.functional_call`):
        >>> targets = select_parameters(model, "query_key")
        >>> def objective(values):
        ...     logits = torch.func.functional_call(model, values, kwargs=inputs).logits
        ...     return task_loss(logits, labels, "regression") + regularizer(values)
        >>> potential = flat_potential(objective, {n: p.shape for n, p in targets.items()})
        >>> point = torch.cat([p.detach().flatten() for p in targets.values()])
    """
    sizes = [math.prod(shape) for shape in shapes.values()]

    def potential(flat: Tensor) -> Tensor:
        pieces = torch.split(flat, sizes)
        values = {
            name: piece.view(shape)
            for (name, shape), piece in zip(shapes.items(), pieces, strict=True)
        }
        return objective(values)

    return potential


def villani_along_ray(
    potential: Callable[[Tensor], Tensor],
    direction: Tensor,
    radii: Sequence[float],
    s: float,
    origin: Tensor | None = None,
    probes: int = 16,
    generator: torch.Generator | None = None,
) -> list[dict[str, float]]:
    """`villani_quantity` at origin + r * direction / ||direction|| for each r in `radii`.

    Returns:
        One dict per radius, with "radius" added.
    """
    unit = direction / direction.norm()
    base = torch.zeros_like(unit) if origin is None else origin
    rows = []
    for radius in radii:
        row = villani_quantity(potential, base + float(radius) * unit, s, probes, generator)
        rows.append({"radius": float(radius), **row})
    return rows
