"""The loss of every layer of a Hugging Face model, read through the model's own head.

A causal LM's head is its output embedding after the final norm (the "logit lens"); a
sequence classifier's head is its pooler and classifier (BERT) or its classification head
(RoBERTa), which :func:`sequence_classification_readout` turns into a readout for any layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor, nn

from convergent.losses.tasks import losses_from_hidden_states

if TYPE_CHECKING:  # transformers is imported when a model is loaded, not with the package
    from transformers import PreTrainedModel

__all__ = [
    "CAUSAL_LM",
    "SEQUENCE_CLASSIFICATION",
    "ReadableModel",
    "layerwise_readout_losses",
    "sequence_classification_readout",
]

# The two kinds of Hugging Face model whose layers can be read through their own head.
CAUSAL_LM = "causal-lm"
SEQUENCE_CLASSIFICATION = "sequence-classification"
# The final normalization that decoder stacks apply before their head (GPT-2, LLaMA, OPT).
FINAL_NORM_NAMES = ("ln_f", "norm", "final_layer_norm")


class ReadableModel(Protocol):
    """A Hugging Face model with its kind, as a loaded ``save_pretrained`` folder has them."""

    @property
    def model(self) -> PreTrainedModel: ...

    @property
    def kind(self) -> str: ...


def sequence_classification_readout(model: nn.Module) -> Callable[..., Tensor]:
    """The shared head of a ``*ForSequenceClassification`` model, for any layer.

    BERT family: the model's own pooler (if it has one: [CLS] -> dense -> tanh), dropout and
    linear ``classifier``; RoBERTa family: its classification head, which picks the first
    token itself. Either way layer L reproduces the model's logits in eval mode.
    """
    classifier = getattr(model, "classifier", None)
    if not isinstance(classifier, nn.Module):
        raise ValueError(
            f"{type(model).__name__} has no classifier module; pass readout= explicitly"
        )
    if not isinstance(classifier, nn.Linear):
        # A head module (RoBERTa, DeBERTa-style) takes the whole sequence and pools it.
        return lambda hidden_state, attention_mask=None: classifier(hidden_state)
    pooler = getattr(getattr(model, "base_model", None), "pooler", None)
    dropout = getattr(model, "dropout", None)

    def readout(hidden_state: Tensor, attention_mask: Any = None) -> Tensor:
        pooled = pooler(hidden_state) if pooler is not None else hidden_state[:, 0]
        if dropout is not None:
            pooled = dropout(pooled)
        return classifier(pooled)

    return readout


def _final_norm(model: nn.Module) -> nn.Module | None:
    base = getattr(model, "base_model", model)
    for name in FINAL_NORM_NAMES:
        module = getattr(base, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def layerwise_readout_losses(
    loaded: ReadableModel,
    hidden_states: Sequence[Tensor],
    labels: Tensor,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """f_0 .. f_L: the loss of every hidden state read through the model's own head.

    A causal LM's head is its output embedding after the final norm (the "logit lens");
    the last hidden state already has that norm applied, so it is read as it is. A
    classifier's head is its pooler and classifier (BERT) or its classification head.

    Args:
        loaded: the model and its kind (``"causal-lm"`` or ``"sequence-classification"``).
        hidden_states: L + 1 tensors from ``output_hidden_states=True``.
        labels: the task's labels (next-token labels for a causal LM).
        attention_mask: the padding mask.

    Returns:
        ``[L + 1]`` losses.

    Raises:
        ValueError: a classifier without a ``classifier`` module to read through.
    """
    model = loaded.model
    if loaded.kind == CAUSAL_LM:
        head, norm = model.get_output_embeddings(), _final_norm(model)
        states = list(hidden_states)
        if norm is not None:
            states = [norm(state) for state in states[:-1]] + states[-1:]
        return losses_from_hidden_states(
            lambda hidden, mask: head(hidden), states, labels, "lm", attention_mask
        )
    readout = sequence_classification_readout(model)
    return losses_from_hidden_states(
        readout, hidden_states, labels, "classification", attention_mask
    )
