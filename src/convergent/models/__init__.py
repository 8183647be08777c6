"""Models that expose every layer's representation and one shared readout head.

`Transformer` is a small configurable Transformer (see `TransformerConfig`); `HFEncoder` gives a
Hugging Face BERT-family encoder the same surface. Both return a `ModelOutput` and have
`readout(hidden_state, attention_mask)`, `num_layers` and `task`. Nothing here imports training
code.
"""

from convergent.models.config import TransformerConfig
from convergent.models.hf import HFEncoder
from convergent.models.lora import add_query_key_lora, lora_parameters
from convergent.models.outputs import ModelOutput
from convergent.models.readout import pool_hidden_state
from convergent.models.transformer import Transformer
from convergent.models.wrappers import unwrap_model

__all__ = [
    "HFEncoder",
    "ModelOutput",
    "Transformer",
    "TransformerConfig",
    "add_query_key_lora",
    "lora_parameters",
    "pool_hidden_state",
    "unwrap_model",
]
