"""`HFEncoder`: a Hugging Face BERT-family encoder seen as "all hidden states + one readout".

The wrapped model is left as `transformers` built it (it stays `self.encoder`, so it can be
saved with `save_pretrained`); only a pooling + linear head is added on top. The hidden states
are exactly the encoder's own (embedding output, then each layer), so anything computed from
them matches `transformers`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.models.outputs import ModelOutput
from convergent.models.readout import check_task_and_pooling, pool_hidden_state

ENCODER_TASKS: tuple[str, ...] = ("classification", "regression")

# Leaf names of the query/key/value projections in the model families we know.
_PROJECTION_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("query", "key", "value"),  # BERT, RoBERTa, ELECTRA, MiniLM
    ("q_lin", "k_lin", "v_lin"),  # DistilBERT
    ("q_proj", "k_proj", "v_proj"),
)


class HFEncoder(nn.Module):
    """A Hugging Face encoder plus a shared pooling + linear readout head.

    Example:
        >>> model = HFEncoder.from_pretrained(minilm_path(), num_outputs=2, pooling="mean")
        >>> out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        >>> len(out.hidden_states) == model.num_layers + 1
        True

    The wrapper starts in the training mode of the wrapped encoder (`from_pretrained` models
    come in eval mode, as in `transformers`); `train()` and `eval()` then switch both together.
    """

    def __init__(
        self,
        encoder: nn.Module,
        task: str = "classification",
        num_outputs: int = 2,
        pooling: str = "cls",
    ) -> None:
        """Wrap an existing encoder.

        Args:
            encoder: a `transformers` encoder model (e.g. `BertModel`) with a `config` that has
                `hidden_size` and `num_hidden_layers`.
            task: "classification" or "regression".
            num_outputs: classes or regression targets.
            pooling: "cls", "mean", "last", or "token" (per-token regression).
        """
        super().__init__()
        check_task_and_pooling(task, pooling, allowed_tasks=ENCODER_TASKS)
        if isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1:
            raise ValueError(f"num_outputs={num_outputs!r} is out of range; it must be >= 1.")
        config: Any = getattr(encoder, "config", None)
        for attribute in ("hidden_size", "num_hidden_layers"):
            if not hasattr(config, attribute):
                raise ValueError(
                    f"encoder of type {type(encoder).__name__} has no config.{attribute}; "
                    "pass a Hugging Face encoder model such as BertModel."
                )
        self.encoder = encoder
        self._task = task
        self._num_layers = int(config.num_hidden_layers)
        self.pooling = pooling
        self.head = nn.Linear(config.hidden_size, num_outputs)
        nn.init.normal_(self.head.weight, mean=0.0, std=getattr(config, "initializer_range", 0.02))
        nn.init.zeros_(self.head.bias)
        self.train(encoder.training)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        task: str = "classification",
        num_outputs: int = 2,
        pooling: str = "cls",
        *,
        attn_implementation: str = "eager",
        keep_pooler: bool = False,
        **from_pretrained_kwargs: Any,
    ) -> HFEncoder:
        """Load `transformers.AutoModel.from_pretrained(path)` and add a new readout head.

        Args:
            path: a local model folder (e.g. `convergent.data.minilm_path()`) or, online, a hub name.
            task: "classification" or "regression".
            num_outputs: classes or regression targets.
            pooling: "cls", "mean", "last", or "token".
            attn_implementation: "eager" (default) runs explicit softmax attention, so hooks on
                the attention modules see real attention weights; "sdpa" is faster.
            keep_pooler: keep BERT's tanh pooler. It is dropped by default because our head
                does not use it, and parameters without gradients break DDP.
            **from_pretrained_kwargs: passed on to `AutoModel.from_pretrained`.

        Returns:
            The wrapped model, in eval mode.
        """
        from transformers import AutoModel  # imported here: `import convergent.models` stays light

        encoder = AutoModel.from_pretrained(
            str(path), attn_implementation=attn_implementation, **from_pretrained_kwargs
        )
        if not keep_pooler and getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None
        return cls(encoder, task=task, num_outputs=num_outputs, pooling=pooling)

    @property
    def num_layers(self) -> int:
        """Number of encoder layers L; `hidden_states` has L + 1 entries."""
        return self._num_layers

    @property
    def hidden_size(self) -> int:
        """Width of every hidden state, the encoder's `hidden_size`."""
        return self.head.in_features

    @property
    def task(self) -> str:
        """The task: "classification" or "regression"."""
        return self._task

    @property
    def attention_projection_names(self) -> dict[str, str]:
        """Leaf module names of the query/key/value projections (e.g. LoRA `target_modules`)."""
        leaf_names = {name.rsplit(".", 1)[-1] for name, _ in self.encoder.named_modules()}
        for query, key, value in _PROJECTION_FAMILIES:
            if {query, key, value} <= leaf_names:
                return {"query": query, "key": key, "value": value}
        raise ValueError(
            f"no known query/key/value projection names in {type(self.encoder).__name__}; "
            f"known families are {_PROJECTION_FAMILIES}."
        )

    def readout(
        self, hidden_state: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The one shared head: pooling then a linear layer (no dropout).

        Args:
            hidden_state: any layer's representation, `[B, T, hidden_size]`.
            attention_mask: `[B, T]`, 1 = real token, 0 = padding.

        Returns:
            `[B, num_outputs]`, or `[B, T, num_outputs]` for pooling="token".
        """
        return self.head(pool_hidden_state(hidden_state, attention_mask, self.pooling))

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Run the encoder and the readout.

        Args:
            input_ids: long `[B, T]` token ids.
            attention_mask: `[B, T]`, 1 = real token, 0 = padding.
            inputs: float `[B, T, hidden_size]`, used as `inputs_embeds` instead of input_ids
                (position and token-type embeddings are still added by the encoder).
            output_hidden_states: also return the L + 1 hidden states.
            token_type_ids: optional `[B, T]` segment ids.

        Returns:
            `ModelOutput` whose `logits` equal `readout(hidden_states[-1], attention_mask)`.
        """
        if (input_ids is None) == (inputs is None):
            raise ValueError("Pass exactly one of input_ids (token ids) and inputs (embeddings).")
        encoded = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden_states = tuple(encoded.hidden_states) if output_hidden_states else None
        last = hidden_states[-1] if hidden_states is not None else encoded.last_hidden_state
        return ModelOutput(logits=self.readout(last, attention_mask), hidden_states=hidden_states)
