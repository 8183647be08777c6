"""Layer sampling: an unbiased estimate of every per-layer loss from a few layers per step.

With a large-vocabulary head, reading out all L + 1 layers costs L + 1 vocabulary
projections. Instead, draw ``count`` of the layers 0..L-1 uniformly without replacement
(each is drawn with probability pi = count / L), always keep the last layer (pi = 1), and
use the inverse-probability (Horvitz-Thompson) estimate

    f_hat_l = f_l * 1[l drawn] / pi_l,   E[f_hat_l] = f_l.

Slacks and the Lagrangian are linear in the f_l, so they are unbiased too, and so is the
primal gradient; the dual step then ascends on an unbiased slack estimate.
"""

from __future__ import annotations

import torch


def sample_layers(num_layers: int, count: int, generator: torch.Generator) -> list[int]:
    """Draw ``count`` of the layers 0..L-1 without replacement, plus layer L; sorted.

    Args:
        num_layers: L (there are L + 1 layer losses, f_0 .. f_L).
        count: how many of the L non-final layers to draw, in [1, L].
        generator: the random source (seed it identically on every process).
    """
    if not 1 <= count <= num_layers:
        raise ValueError(f"layers per step is {count}; it must be in [1, {num_layers}]")
    drawn = torch.randperm(num_layers, generator=generator)[:count]
    return [*sorted(int(i) for i in drawn), num_layers]


def inverse_probability_losses(
    sampled_losses: torch.Tensor, layers: list[int], num_layers: int, count: int
) -> torch.Tensor:
    """The unbiased estimate ``[f_hat_0 .. f_hat_L]`` from the losses of the drawn layers.

    Args:
        sampled_losses: losses at ``layers`` (in that order), with gradient.
        layers: the output of :func:`sample_layers`.
        num_layers: L.
        count: the ``count`` passed to :func:`sample_layers`.
    """
    if sampled_losses.shape != (len(layers),):
        raise ValueError(
            f"{tuple(sampled_losses.shape)} sampled losses for {len(layers)} drawn layers"
        )
    probability = torch.full((num_layers + 1,), count / num_layers, dtype=sampled_losses.dtype)
    probability[num_layers] = 1.0
    index = torch.tensor(layers, device=sampled_losses.device)
    weights = (1.0 / probability.to(sampled_losses.device))[index]
    estimate = sampled_losses.new_zeros(num_layers + 1)
    return estimate.index_add(0, index, sampled_losses * weights)
