"""One-shot pruning of a trained model (magnitude, Wanda, SparseGPT), and the perplexity it costs.

    report = prune_one_shot(model, 0.5, method="sparsegpt", calibration=batches,
                            spec=MaskSpec(pattern="2:4"))
    print(report.summary()["layers"])       # each matrix's sparsity, method and seconds

Magnitude needs no data; Wanda and SparseGPT read calibration batches block by block
(:mod:`convergent.sparse.blockwise`). Works on our Transformer and on ``transformers``
models; GPT-2's ``Conv1D`` layers (weights stored ``[in, out]``) are handled, and tied
input/output embeddings are pruned once, by neither side unless the spec includes
embeddings; the report says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from convergent.sparse.blockwise import CALIBRATED, BlockwisePruner, check_method
from convergent.sparse.masks import Masks, check_sparsity, magnitude_masks
from convergent.sparse.spec import MaskSpec

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
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        spec: the mask spec.
        layers: per pruned matrix: name, shape, sparsity, method, stage (block) and seconds.
    """

    masks: Masks
    target: float
    sparsity: float
    prunable: int
    pruned: int
    total: int
    excluded: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    method: str = "magnitude"
    spec: MaskSpec = field(default_factory=MaskSpec)
    layers: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """The report without the masks, ready for JSON."""
        return {
            "target": self.target,
            "sparsity": self.sparsity,
            "prunable": self.prunable,
            "pruned": self.pruned,
            "total": self.total,
            "model_sparsity": self.pruned / max(self.total, 1),
            "method": self.method,
            "spec": self.spec.as_dict(),
            "excluded": dict(self.excluded),
            "notes": list(self.notes),
            "layers": [dict(layer) for layer in self.layers],
        }


@torch.no_grad()
def prune_one_shot(
    model: nn.Module,
    sparsity: float,
    *,
    spec: MaskSpec | None = None,
    method: str = "magnitude",
    calibration: Iterable[Mapping[str, Tensor]] | None = None,
    options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> PruningReport:
    """Prune ``model`` in place, once.

    Args:
        model: the trained model (unwrapped).
        sparsity: the fraction of prunable weights to zero, in [0, 1) (N:M prunes 1 - N/M).
        spec: which weights, the distribution and the pattern; None is ``MaskSpec()``.
        method: ``"magnitude"`` (no data), ``"wanda"`` or ``"sparsegpt"`` (calibrated, with a
            ``"uniform"`` distribution).
        calibration: batches of model inputs for Wanda and SparseGPT (dicts such as
            ``{"input_ids": ..., "attention_mask": ...}``; ``labels`` are ignored). Take them
            from a training split, never from the data the pruned model is scored on.
        options: SparseGPT's ``block_size`` and ``damping``.
        progress: a progress bar over the blocks.

    Returns:
        A :class:`PruningReport`.
    """
    check_sparsity(sparsity)
    spec = MaskSpec.given(spec)
    check_method(method, spec)
    if method in CALIBRATED and calibration is None:
        raise ValueError(f"method {method!r} needs calibration batches; magnitude needs none")
    if options and method != "sparsegpt":
        raise ValueError(f"options {sorted(options)} apply to sparsegpt only, not {method!r}")
    selection = spec.select(model)
    for note in selection.notes():
        logger.info("%s", note)
    if method == "magnitude":
        masks = magnitude_masks(model, selection.names, sparsity, spec, selection.input_dims)
        masks.apply(model)
        records: list[dict[str, Any]] = [
            {"method": "magnitude", "stage": "all", "seconds": None} for _ in range(len(masks))
        ]
    else:
        assert calibration is not None
        pruner = BlockwisePruner(model, selection, sparsity, spec, method, options, progress)
        masks = pruner.run(calibration)
        by_name = {record.name: record for record in pruner.records}
        records = [
            {
                "method": by_name[name].method,
                "stage": by_name[name].stage,
                "seconds": by_name[name].seconds,
            }
            for name in masks
        ]
    layers = [
        {"name": name, "shape": list(mask.shape), "sparsity": value, **record}
        for (name, mask), value, record in zip(
            masks.items(), masks.per_parameter_sparsity().values(), records, strict=True
        )
    ]
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
        method=method,
        spec=spec,
        layers=layers,
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
