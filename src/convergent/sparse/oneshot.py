"""One-shot magnitude pruning of a trained model, and the perplexity it costs a language model.

Layer-wise (``distribution="uniform"``, the default): every prunable weight matrix loses the
same fraction of its smallest magnitudes. Works on our Transformer and on ``transformers``
models; GPT-2's ``Conv1D`` layers (weights stored ``[in, out]``) are handled, and tied
input/output embeddings are pruned by neither side unless ``include_embeddings=True``; the
report says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .masks import Masks, magnitude_masks
from .selection import select_prunable

logger = logging.getLogger(__name__)


@dataclass
class PruningReport:
    """What :func:`prune_one_shot` did.

    Attributes:
        masks: the masks it applied.
        target: the requested sparsity.
        sparsity: the achieved sparsity over the prunable parameters.
        prunable: entries in the prunable parameters.
        pruned: entries set to zero.
        total: entries in every parameter of the model.
        excluded: weight matrices left dense -> why.
        notes: one line per exclusion (also logged).
    """

    masks: Masks
    target: float
    sparsity: float
    prunable: int
    pruned: int
    total: int
    excluded: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """The report without the masks, ready for JSON."""
        return {
            "target": self.target,
            "sparsity": self.sparsity,
            "prunable": self.prunable,
            "pruned": self.pruned,
            "total": self.total,
            "model_sparsity": self.pruned / max(self.total, 1),
            "excluded": dict(self.excluded),
            "notes": list(self.notes),
        }


@torch.no_grad()
def prune_one_shot(
    model: nn.Module,
    sparsity: float,
    *,
    distribution: str = "uniform",
    pattern: str = "unstructured",
    include_embeddings: bool = False,
    include_first: bool = True,
    include_last: bool = False,
    exclude: tuple[str, ...] = (),
) -> PruningReport:
    """Prune ``model`` in place by weight magnitude, once.

    Args:
        model: the trained model (unwrapped).
        sparsity: the fraction of prunable weights to zero, in [0, 1).
        distribution: ``"uniform"`` (layer-wise, default) or ``"global"``.
        pattern: ``"unstructured"`` or ``"N:M"``.
        include_embeddings: prune embeddings too (tied input/output embeddings included).
        include_first: prune the first linear layer (by default yes: in a language model it
            is an attention projection, not an input layer).
        include_last: prune the last linear layer (an untied LM head).
        exclude: name substrings to leave dense.

    Returns:
        A :class:`PruningReport`.
    """
    selection = select_prunable(
        model,
        include_embeddings=include_embeddings,
        include_first=include_first,
        include_last=include_last,
        exclude=exclude,
    )
    for note in selection.notes():
        logger.info("%s", note)
    masks = magnitude_masks(
        model,
        selection.names,
        sparsity,
        distribution=distribution,
        pattern=pattern,
        input_dims=selection.input_dims,
    )
    masks.apply(model)
    prunable = masks.numel
    pruned = prunable - masks.kept
    return PruningReport(
        masks=masks,
        target=sparsity,
        sparsity=pruned / max(prunable, 1),
        prunable=prunable,
        pruned=pruned,
        total=sum(parameter.numel() for parameter in model.parameters()),
        excluded=dict(selection.excluded),
        notes=selection.notes(),
    )


def _logits(output: object) -> Tensor:
    logits = getattr(output, "logits", output)
    if not isinstance(logits, Tensor):
        raise TypeError(f"the model's output has no logits tensor: {type(output).__name__}")
    return logits


@torch.no_grad()
def perplexity(model: nn.Module, batches: Iterable[dict[str, Tensor]]) -> float:
    """exp(mean next-token cross-entropy) over ``batches``.

    Each batch holds ``input_ids`` and ``labels`` aligned with the logits (the next token at
    each position, ``-100`` to ignore), as in ``convergent.data``; ``attention_mask`` is
    passed on when present. The model's output may be a tensor or have ``.logits`` (ours and
    ``transformers``' both do).
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in batches:
            inputs = {key: value for key, value in batch.items() if key != "labels"}
            logits = _logits(model(**inputs)).float()
            labels = batch["labels"].to(logits.device)
            total += float(
                F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]),
                    labels.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
            )
            count += int((labels != -100).sum())
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("no tokens to score: every label is -100 or there are no batches")
    return math.exp(total / count)
