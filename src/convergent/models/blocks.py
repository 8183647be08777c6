"""Self-attention, feed-forward network and the residual block with coefficient beta."""

from __future__ import annotations

import math

import torch
from torch import nn

from convergent.models.config import TransformerConfig


def attention_allowed(
    sequence_length: int, keep: torch.Tensor | None, causal: bool, device: torch.device
) -> torch.Tensor | None:
    """Which key positions each query may attend to, broadcastable to `[B, H, T, T]`.

    Args:
        sequence_length: T.
        keep: bool `[B, T]`, True = real token; `None` means every token is real.
        causal: forbid attending to later positions.
        device: where to build the causal mask.

    Returns:
        bool `[B or 1, 1, T, T]` (True = allowed), or `None` when everything is allowed.
    """
    allowed = None
    if causal:
        allowed = torch.ones(
            sequence_length, sequence_length, dtype=torch.bool, device=device
        ).tril()[None, None]
    if keep is not None:
        keys = keep[:, None, None, :]
        allowed = keys if allowed is None else allowed & keys
    return allowed


class SelfAttention(nn.Module):
    """Multi-head softmax self-attention with explicit math, so every piece can be hooked.

    Attn(X) = concat_h softmax(Q_h K_h^T / sqrt(d_head) + mask) V_h  W_O, with Q = X W_Q,
    K = X W_K, V = X W_V. The projections are separate `nn.Linear`s named `q_proj`, `k_proj`,
    `v_proj`, `o_proj` so that LoRA and regularizers can target them by name. A forward hook on
    `attention_weights` (an identity) sees the softmax weights `[B, H, T, T]`; a hook on this
    module sees Attn(X).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        d_model = config.d_model
        self.q_proj = nn.Linear(d_model, d_model, bias=config.bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=config.bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=config.bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=config.bias)
        self.attention_weights = nn.Identity()
        self.attention_dropout = nn.Dropout(config.dropout)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Apply attention to `x` `[B, T, d_model]`; `allowed` comes from `attention_allowed`."""
        query = self._split_heads(self.q_proj(x))
        key = self._split_heads(self.k_proj(x))
        value = self._split_heads(self.v_proj(x))
        scores = query @ key.transpose(-2, -1) / math.sqrt(self.head_dim)
        if allowed is not None:
            # The most negative finite value, not -inf: a row with no allowed key (e.g. left
            # padding under a causal mask) becomes uniform instead of NaN.
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = self.attention_weights(torch.softmax(scores, dim=-1))
        mixed = self.attention_dropout(weights) @ value
        batch, _, length, _ = mixed.shape
        return self.o_proj(mixed.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    """FFN(X) = act(X W_up + b_up) W_down + b_down, applied to each token."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.d_model, config.feed_forward_dim, bias=config.bias)
        self.activation = nn.GELU() if config.activation == "gelu" else nn.ReLU()
        self.down_proj = nn.Linear(config.feed_forward_dim, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the network to `x` `[B, T, d_model]`."""
        return self.down_proj(self.activation(self.up_proj(x)))


def _layer_norm_or_identity(config: TransformerConfig) -> nn.Module:
    if config.norm == "none":
        return nn.Identity()
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


class Block(nn.Module):
    """One layer: attention then FFN, each with residual coefficient beta.

    norm="pre":  Y = beta * X + Attn(LN1(X));  Z = beta * Y + FFN(LN2(Y))
    norm="post": Y = LN1(beta * X + Attn(X));  Z = LN2(beta * Y + FFN(Y))
    norm="none": Y = beta * X + Attn(X);       Z = beta * Y + FFN(Y)
    Dropout (if any) is applied to Attn(.) and FFN(.) before they are added.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.beta = config.beta
        self.norm_placement = config.norm
        self.attention = SelfAttention(config)
        self.feed_forward = FeedForward(config)
        self.residual_dropout = nn.Dropout(config.dropout)
        self.attention_norm = _layer_norm_or_identity(config)
        self.feed_forward_norm = _layer_norm_or_identity(config)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Map `x` `[B, T, d_model]` to the block output of the same shape."""
        if self.norm_placement == "pre":
            y = self.beta * x + self.residual_dropout(
                self.attention(self.attention_norm(x), allowed)
            )
            return self.beta * y + self.residual_dropout(
                self.feed_forward(self.feed_forward_norm(y))
            )
        # "post" and "none" share the formula; for "none" the norms are identities.
        y = self.attention_norm(self.beta * x + self.residual_dropout(self.attention(x, allowed)))
        return self.feed_forward_norm(self.beta * y + self.residual_dropout(self.feed_forward(y)))
