"""A small configurable Transformer: encoder or causal decoder, every hidden state out.

In the spirit of minGPT / nanoGPT: this file knows nothing of training. Every layer's
representation can be read out by the one shared head, `readout`, which is what layer-wise
descent constraints need.
"""

from __future__ import annotations

import torch
from torch import nn

from convergent.models.blocks import Block, attention_allowed
from convergent.models.config import TransformerConfig
from convergent.models.outputs import ModelOutput
from convergent.models.readout import keep_mask, pool_hidden_state


class Transformer(nn.Module):
    """Token or continuous inputs -> learned positions -> L blocks -> shared readout.

    Example:
        >>> config = TransformerConfig(vocab_size=100, d_model=32, n_heads=4, n_layers=2)
        >>> model = Transformer(config)
        >>> out = model(input_ids=torch.zeros(3, 7, dtype=torch.long), output_hidden_states=True)
        >>> out.logits.shape, len(out.hidden_states)
        (torch.Size([3, 2]), 3)
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding: nn.Embedding | None = None
        self.input_projection: nn.Linear | None = None
        if config.vocab_size is not None:
            self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        else:
            assert config.input_dim is not None  # the config guarantees exactly one is set
            self.input_projection = nn.Linear(config.input_dim, config.d_model, bias=config.bias)
        self.position_embedding = nn.Embedding(config.max_len, config.d_model)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        # With pre-norm the residual stream is never normalised inside the blocks, so the
        # final norm is part of the shared readout and sees every layer's representation.
        self.final_norm: nn.Module = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.norm == "pre"
            else nn.Identity()
        )
        if config.task == "lm":
            assert config.vocab_size is not None
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        else:
            self.head = nn.Linear(config.d_model, config.num_outputs, bias=config.bias)
        self.apply(self._init_weights)
        if config.tie_embeddings:
            assert self.token_embedding is not None
            self.head.weight = self.token_embedding.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def num_layers(self) -> int:
        """Number of blocks L; `hidden_states` has L + 1 entries."""
        return self.config.n_layers

    @property
    def hidden_size(self) -> int:
        """Width of every hidden state, `d_model`."""
        return self.config.d_model

    @property
    def task(self) -> str:
        """The task: "classification", "regression" or "lm"."""
        return self.config.task

    @property
    def attention_projection_names(self) -> dict[str, str]:
        """Module names (last component) of the attention projections, e.g. for LoRA targets."""
        return {"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "o_proj"}

    def embed(
        self, input_ids: torch.Tensor | None = None, inputs: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The embedding output (hidden state 0): token or input embedding plus positions.

        Args:
            input_ids: long `[B, T]`, for a config with `vocab_size`.
            inputs: float `[B, T, input_dim]`, for a config with `input_dim`.

        Returns:
            `[B, T, d_model]`.
        """
        if (input_ids is None) == (inputs is None):
            raise ValueError("Pass exactly one of input_ids (token inputs) and inputs (features).")
        if input_ids is not None:
            if self.token_embedding is None:
                raise ValueError(
                    f"input_ids was given but this model takes continuous inputs of "
                    f"input_dim={self.config.input_dim}; pass inputs=[B, T, input_dim]."
                )
            embedded = self.token_embedding(input_ids)
        else:
            assert inputs is not None
            if self.input_projection is None:
                raise ValueError(
                    f"inputs was given but this model takes token ids (vocab_size="
                    f"{self.config.vocab_size}); pass input_ids=[B, T]."
                )
            if inputs.dim() != 3 or inputs.shape[-1] != self.config.input_dim:
                raise ValueError(
                    f"inputs has shape {tuple(inputs.shape)}; expected [B, T, "
                    f"{self.config.input_dim}]."
                )
            embedded = self.input_projection(inputs)
        length = embedded.shape[1]
        if not 1 <= length <= self.config.max_len:
            raise ValueError(
                f"sequence length {length} is out of range; allowed range is "
                f"[1, {self.config.max_len}] (max_len)."
            )
        positions = torch.arange(length, device=embedded.device)
        return self.embedding_dropout(embedded + self.position_embedding(positions))

    def readout(
        self, hidden_state: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The one shared head: final norm (pre-norm only), pooling, then the linear head.

        Args:
            hidden_state: any layer's representation, `[B, T, d_model]`.
            attention_mask: `[B, T]`, 1 = real token, 0 = padding (used by "mean"/"last").

        Returns:
            `[B, num_outputs]`, `[B, T, num_outputs]` (pooling="token") or
            `[B, T, vocab_size]` (task="lm").
        """
        normed = self.final_norm(hidden_state)
        pooling = "token" if self.config.task == "lm" else self.config.pooling
        return self.head(pool_hidden_state(normed, attention_mask, pooling))

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> ModelOutput:
        """Run the model.

        Args:
            input_ids: long `[B, T]` token ids (token-input models).
            attention_mask: `[B, T]`, 1 = real token, 0 = padding; padding keys are never
                attended to. `None` means no padding.
            inputs: float `[B, T, input_dim]` (continuous-input models).
            output_hidden_states: also return the L + 1 hidden states.

        Returns:
            `ModelOutput` whose `logits` equal `readout(hidden_states[-1], attention_mask)`.
        """
        hidden = self.embed(input_ids=input_ids, inputs=inputs)
        batch, length, _ = hidden.shape
        if attention_mask is not None and tuple(attention_mask.shape) != (batch, length):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}; expected "
                f"{(batch, length)} to match the inputs."
            )
        allowed = attention_allowed(
            length, keep_mask(attention_mask), self.config.causal, hidden.device
        )
        hidden_states = [hidden]
        for block in self.blocks:
            hidden = block(hidden, allowed)
            hidden_states.append(hidden)
        return ModelOutput(
            logits=self.readout(hidden, attention_mask),
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
        )
