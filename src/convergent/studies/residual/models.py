"""The ``residual`` study's models: the paper's one-layer Transformer (part a), and MiniLM cut
or extended to a depth with a residual coefficient in every layer (part b).

Part (a): one block (single-head softmax attention + FFN, residual coefficient beta, no
LayerNorm) read out from the last token. Part (b): a depth-L encoder is MiniLM-L6 with its
layer list cut or extended: depth <= 6 keeps the first L pretrained layers; depth > 6 keeps all
six and appends L - 6 freshly initialized BERT layers (BERT's initializer, N(0, 0.02)) on top.
The residual coefficient beta is applied inside both sublayers of every layer by
`ScaledResidualOutput`, which replaces BERT's ``LayerNorm(dropout(dense(h)) + x)`` with
``LayerNorm(dropout(dense(h)) + beta * x)``; beta = 1 is MiniLM unchanged, beta = 0 removes
every residual connection. The parameter names stay those of BERT (``dense``, ``LayerNorm``),
so checkpoints and LoRA targets are unaffected.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from convergent.models import HFEncoder, Transformer, TransformerConfig


def one_layer_model(
    input_dim: int,
    num_outputs: int,
    window: int,
    d_model: int,
    d_ff: int,
    beta: float,
    init_std: float,
    seed: int,
) -> Transformer:
    """The paper's model: one block, one head, no norm, readout from the last token."""
    torch.manual_seed(seed)
    return Transformer(
        TransformerConfig(
            task="regression",
            num_outputs=num_outputs,
            input_dim=input_dim,
            max_len=window,
            d_model=d_model,
            n_heads=1,
            n_layers=1,
            d_ff=d_ff,
            beta=beta,
            norm="none",
            pooling="last",
            dropout=0.0,
            init_std=init_std,
        )
    )


class ScaledResidualOutput(nn.Module):
    """BERT's sublayer output with a residual coefficient: LN(dropout(dense(h)) + beta * x).

    Args:
        original: a ``BertSelfOutput`` or ``BertOutput`` (anything with ``dense``, ``dropout``
            and ``LayerNorm``); its modules are reused, not copied.
        beta: the residual coefficient in [0, 1].
    """

    def __init__(self, original: Any, beta: float) -> None:
        super().__init__()
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta={beta} is out of range; allowed range is [0, 1].")
        self.dense = original.dense
        self.dropout = original.dropout
        self.LayerNorm = original.LayerNorm  # BERT's name, kept so state dicts still match
        self.beta = float(beta)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        """The sublayer output for branch input ``hidden_states`` and residual ``input_tensor``."""
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + self.beta * input_tensor)


def set_residual_coefficient(encoder: Any, beta: float) -> int:
    """Wrap every BERT sublayer output of ``encoder`` in `ScaledResidualOutput`; returns how
    many were wrapped (two per layer)."""
    wrapped = 0
    for layer in encoder.encoder.layer:
        for owner, attribute in ((layer.attention, "output"), (layer, "output")):
            current = getattr(owner, attribute)
            if isinstance(current, ScaledResidualOutput):
                current.beta = float(beta)
            else:
                setattr(owner, attribute, ScaledResidualOutput(current, beta))
            wrapped += 1
    return wrapped


def _reinitialize(layer: Any, std: float) -> None:
    """BERT's initializer: linear weights N(0, std) and zero biases, LayerNorm 1 and 0."""
    with torch.no_grad():
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()


def load_minilm(path: Any) -> Any:
    """The pretrained MiniLM-L6 encoder (a ``BertModel``, sdpa attention, no pooler)."""
    return HFEncoder.from_pretrained(path, attn_implementation="sdpa").encoder


def minilm_at_depth(
    pretrained_encoder: nn.Module, depth: int, beta: float, seed: int, pooling: str = "mean"
) -> tuple[HFEncoder, str]:
    """A copy of a pretrained BERT-family encoder cut or extended to ``depth`` layers, with
    residual coefficient ``beta`` and a new classification head (seeded with ``seed``).

    Returns:
        ``(model, description)``; the description says which layers are pretrained.
    """
    if depth < 1:
        raise ValueError(f"depth={depth} is out of range; it must be >= 1.")
    torch.manual_seed(seed)
    encoder: Any = copy.deepcopy(pretrained_encoder)
    layers = encoder.encoder.layer
    pretrained = len(layers)
    if depth <= pretrained:
        encoder.encoder.layer = nn.ModuleList(list(layers)[:depth])
        description = f"pretrained layers 0-{depth - 1}"
    else:
        extra = []
        for _ in range(depth - pretrained):
            fresh = copy.deepcopy(layers[-1])
            _reinitialize(fresh, float(getattr(encoder.config, "initializer_range", 0.02)))
            extra.append(fresh)
        encoder.encoder.layer = nn.ModuleList([*layers, *extra])
        description = (
            f"pretrained layers 0-{pretrained - 1} + {depth - pretrained} randomly "
            f"initialized layers on top"
        )
    encoder.config.num_hidden_layers = depth
    set_residual_coefficient(encoder, beta)
    model = HFEncoder(encoder, task="classification", num_outputs=2, pooling=pooling)
    model.train()
    return model, description
