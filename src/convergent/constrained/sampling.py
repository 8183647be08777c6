"""Layer sampling: an unbiased estimate of every per-layer loss from a few layers per step.

With a large-vocabulary head, reading out all L + 1 layers costs L + 1 vocabulary
projections. Instead, draw ``count`` of the layers 0..L-1 uniformly without replacement
(each is drawn with probability pi = count / L), always keep the last layer (pi = 1), and
use the inverse-probability (Horvitz-Thompson) estimate

    f_hat_l = f_l * 1[l drawn] / pi_l,   E[f_hat_l] = f_l.

Slacks and the Lagrangian are linear in the f_l, so they are unbiased too, and so is the
primal gradient; the dual step then ascends on an unbiased slack estimate.

Token sampling (language models): an intermediate layer's loss, the mean next-token
cross-entropy over the n target tokens of the batch, is estimated by its mean over k of them
drawn uniformly without replacement (`sample_tokens`), so only k rows of the vocabulary
projection are computed. The sample mean is unbiased, with variance (1 - k/n) sigma^2 / k
for a per-token loss variance sigma^2: a fraction k/n = 1/16 of 1,024 tokens leaves the
standard error at about sigma / 8, while the last layer, the objective, stays exact.
"""

from __future__ import annotations

import math

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


def check_token_fraction(fraction: float) -> None:
    """Raises unless ``fraction`` (the share of target tokens read out) is in (0, 1]."""
    if not 0 < fraction <= 1:
        raise ValueError(f"token_fraction is {fraction}; it must be in (0, 1].")


def sample_tokens(labels: torch.Tensor, fraction: float, generator: torch.Generator,
                  ignore_index: int) -> torch.Tensor:  # fmt: skip
    """Flat indices of ceil(fraction * n) of the n target tokens of ``labels`` (those not
    ``ignore_index``), drawn uniformly without replacement; sorted.

    Args:
        labels: the next-token targets, any shape (indices refer to ``labels.reshape(-1)``).
        fraction: the share of target tokens to keep, in (0, 1].
        generator: the random source (a CPU generator).
        ignore_index: the label of positions without a target.
    """
    check_token_fraction(fraction)
    targets = (labels.reshape(-1) != ignore_index).nonzero().reshape(-1).cpu()
    count = max(1, math.ceil(fraction * targets.numel())) if targets.numel() else 0
    drawn = targets[torch.randperm(targets.numel(), generator=generator)[:count]]
    return drawn.sort().values.to(labels.device)


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
