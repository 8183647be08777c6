"""Rank collapse: how far token representations are from rank one.

For a representation X (T tokens x d) with token mean x_bar, the relative residual

    r(X) = ||X - 1 x_bar^T||_F / ||X||_F

is 0 when every token carries the same vector (the rank-one collapse that pure softmax
attention drives towards with depth; Dong, Cordonnier and Loukas, 2021) and grows as
tokens differ. The column mean x_bar is the minimiser of ||X - 1 x^T||_F over x.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from convergent.models import unwrap_model


def rank_collapse(
    hidden_state: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """||X - 1 x_bar^T||_F / ||X||_F per example, over the kept (non-padding) tokens.

    Args:
        hidden_state: ``[B, T, d]``.
        attention_mask: ``[B, T]``, 1 = real token; ``None`` keeps every token.

    Returns:
        ``[B]``; 0 for an example whose representation is all zeros.
    """
    if hidden_state.dim() != 3:
        raise ValueError(f"hidden_state has shape {tuple(hidden_state.shape)}; expected [B, T, d].")
    values = hidden_state.detach().double()
    if attention_mask is None:
        weights = torch.ones(values.shape[:2], dtype=values.dtype, device=values.device)
    else:
        weights = (attention_mask != 0).to(values.dtype)
    weights = weights[..., None]
    count = weights.sum(dim=1).clamp(min=1.0)
    mean = (values * weights).sum(dim=1, keepdim=True) / count[:, None]
    centred = ((values - mean) * weights).flatten(1).norm(dim=1)
    total = (values * weights).flatten(1).norm(dim=1)
    return torch.where(
        total > 0, centred / total.clamp(min=1e-300), torch.zeros_like(total)
    ).float()


def layerwise_rank_collapse(
    model: nn.Module, batch: dict[str, torch.Tensor], layers: Sequence[int] | None = None
) -> torch.Tensor:
    """Rank-collapse residual of every hidden state, ``[L + 1, B]`` (embedding output first).

    Runs one forward pass under ``torch.no_grad`` in the model's current train/eval mode.
    """
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        output = model(**inputs, output_hidden_states=True)
    if output.hidden_states is None:
        raise ValueError(f"{type(unwrap_model(model)).__name__} returned no hidden states")
    chosen = range(len(output.hidden_states)) if layers is None else layers
    mask = inputs.get("attention_mask")
    return torch.stack([rank_collapse(output.hidden_states[i], mask) for i in chosen])
