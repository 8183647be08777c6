"""The output every model in `convergent.models` returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """What a forward pass returns.

    Attributes:
        logits: `[B, num_outputs]` for pooled classification or regression, `[B, T, num_outputs]`
            for per-token regression, `[B, T, vocab_size]` for language modelling. Always equal
            to `model.readout(hidden_states[-1], attention_mask)`.
        hidden_states: `None` unless `output_hidden_states=True`; then L + 1 tensors of shape
            `[B, T, d_model]`: the embedding output, then the output of each of the L layers.
    """

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
