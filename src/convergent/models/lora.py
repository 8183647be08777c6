"""LoRA on the query and key projections, through Hugging Face PEFT (not a LoRA of our own).

`add_query_key_lora(model)` is `peft.get_peft_model` with a `LoraConfig` whose
`target_modules` are the model's own query/key projection names (`q_proj`, `k_proj` in our
`Transformer`; `query`, `key` in MiniLM/BERT), read from `model.attention_projection_names`.
PEFT freezes everything else; the wrapped model keeps `forward`, `readout`, `num_layers` and
`task` (PEFT forwards attribute access to the base model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

__all__ = ["add_query_key_lora", "lora_parameters"]


def add_query_key_lora(
    model: nn.Module,
    rank: int = 4,
    alpha: int | None = None,
    dropout: float = 0.0,
    target_modules: Sequence[str] | None = None,
) -> Any:
    """Wrap `model` in a PEFT LoRA model whose only trainable tensors are the LoRA factors.

    Each targeted linear layer computes W x + (alpha / rank) B A x, with A [rank, in] and
    B [out, rank] (PEFT initializes B = 0, so the wrapped model starts equal to `model`).

    Args:
        model: a convergent `Transformer` or `HFEncoder` (or any module with
            `attention_projection_names`), or any module if `target_modules` is given.
        rank: LoRA rank r, >= 1.
        alpha: LoRA alpha; None means alpha = rank (scaling 1).
        dropout: LoRA dropout probability, in [0, 1).
        target_modules: leaf module names to adapt; None means the query and key projections.

    Returns:
        A `peft.PeftModel`.
    """
    from peft import LoraConfig, get_peft_model  # imported here: `import convergent` stays light

    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an integer >= 1, got {rank!r}.")
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}.")
    if target_modules is None:
        names = getattr(model, "attention_projection_names", None)
        if names is None:
            raise ValueError(
                f"{type(model).__name__} has no attention_projection_names; pass target_modules."
            )
        target_modules = [names["query"], names["key"]]
    config = LoraConfig(
        r=rank,
        lora_alpha=rank if alpha is None else alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
    )
    return get_peft_model(model, config)


def lora_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The LoRA factors (`lora_A`, `lora_B`) of a PEFT model, by name."""
    return {
        name: parameter
        for name, parameter in model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    }
