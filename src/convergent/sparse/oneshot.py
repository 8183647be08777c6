"""One-shot pruning of a trained model (magnitude, Wanda, SparseGPT), and the perplexity it costs.

    report = prune_one_shot(model, 0.5, method="sparsegpt", calibration=batches,
                            spec=MaskSpec(pattern="2:4"), device="cuda")
    print(report.summary()["layers"])       # each matrix's sparsity, method and seconds

Magnitude needs no data (unless OWL allocates the sparsities); Wanda and SparseGPT read
calibration batches block by block (:mod:`convergent.sparse.blockwise`), on ``device`` when
given, while the model stays where it is. The methods are found by name in
:data:`~convergent.sparse.pruners.PRUNERS`. Works on our Transformer and on ``transformers``
models; GPT-2's ``Conv1D`` layers (weights stored ``[in, out]``) are handled, and tied
input/output embeddings are pruned once, by neither side unless the spec includes
embeddings; the report says so.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from convergent.models.placement import BlockHost, check_device, home_device
from convergent.sparse.blockwise import BlockwisePruner
from convergent.sparse.calibration import LayerPruned
from convergent.sparse.masks import Masks, check_sparsity, magnitude_masks
from convergent.sparse.pruners import Pruner, make_pruner, pruner_options
from convergent.sparse.spec import MaskSpec
from convergent.wording import option

logger = logging.getLogger(__name__)

# How far the pruned layers' share of zeros may fall from the target without a caveat.
SPARSITY_SLACK = 0.005


@dataclass
class PruningReport:
    """What :func:`prune_one_shot` did.

    Attributes:
        masks: the masks it applied (empty when they were not kept: a streamed model).
        target: the requested sparsity.
        sparsity: the achieved sparsity over the prunable parameters.
        prunable: entries in the prunable parameters.
        pruned: entries set to zero.
        total: entries in every parameter of the model.
        excluded: weight matrices left dense -> why.
        notes: one line per exclusion (also logged).
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        spec: the mask spec.
        layers: per pruned matrix: name, shape, sparsity, target, method, stage (block) and
            seconds.
        options: the pruner's options (e.g. SparseGPT's block size and damping).
        block_sparsities: OWL's sparsity of each block (block index -> sparsity).
        caveats: why the result differs from what was asked (a sparsity reached more than
            :data:`SPARSITY_SLACK` from the target), one sentence each.
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
    options: dict[str, Any] = field(default_factory=dict)
    block_sparsities: dict[int, float] = field(default_factory=dict)
    caveats: list[str] = field(default_factory=list)

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
            "options": dict(self.options),
            "spec": self.spec.as_dict(),
            "block_sparsities": {str(k): v for k, v in self.block_sparsities.items()},
            "excluded": dict(self.excluded),
            "notes": list(self.notes),
            "caveats": list(self.caveats),
            "layers": [dict(layer) for layer in self.layers],
        }


def check_one_shot(method: str, spec: MaskSpec, options: Mapping[str, Any] | None = None) -> Pruner:
    """The pruner ``method`` (with ``options``) if it can prune with ``spec``; else one
    ValueError sentence (so a command can check its arguments before loading a model)."""
    pruner = make_pruner(method, options)
    if spec.distribution == "global" and pruner.calibrated:
        raise ValueError(
            f"{method} prunes every layer on its own; {option('distribution', 'global')} is for"
            f" magnitude pruning only (use {option('distribution', 'uniform')} or"
            f" {option('distribution', 'owl')})"
        )
    return pruner


@torch.no_grad()
def prune_one_shot(
    model: nn.Module,
    sparsity: float,
    *,
    spec: MaskSpec | None = None,
    method: str = "magnitude",
    calibration: Iterable[Mapping[str, Tensor]] | None = None,
    options: Mapping[str, Any] | None = None,
    device: str | torch.device | None = None,
    host: BlockHost | None = None,
    keep_masks: bool = True,
    progress: bool = False,
) -> PruningReport:
    """Prune ``model`` in place, once.

    Args:
        model: the trained model (unwrapped).
        sparsity: the fraction of prunable weights to zero, in [0, 1) (N:M prunes 1 - N/M; OWL
            gives each block its own sparsity around it).
        spec: which weights, the distribution and the pattern; None is ``MaskSpec()``.
        method: ``"magnitude"`` (no data), ``"wanda"`` or ``"sparsegpt"`` (calibrated, with a
            ``"uniform"`` or ``"owl"`` distribution).
        calibration: batches of model inputs for Wanda, SparseGPT and OWL (dicts such as
            ``{"input_ids": ..., "attention_mask": ...}``; ``labels`` are ignored). Take them
            from a training split, never from the data the pruned model is scored on.
        options: the pruner's options (SparseGPT: ``block_size``, ``damping``, ``per_row``;
            Wanda: ``rounding``); see :mod:`convergent.sparse.pruners`.
        device: where each block is calibrated and pruned (``"cpu"``, ``"cuda"``,
            ``"cuda:1"``); the model stays where it is. None: the model's own device.
        host: what brings each block to the device and home (None: the model is in memory;
            :class:`convergent.models.streamed.StreamedBlocks` streams it from its files).
        keep_masks: return the masks in the report (a model larger than memory: off).
        progress: a progress bar over the blocks.

    Returns:
        A :class:`PruningReport`.
    """
    check_sparsity(sparsity)
    spec = MaskSpec.given(spec)
    pruner = check_one_shot(method, spec, options)
    compute = check_device(device)
    needs_data = pruner.calibrated or spec.distribution == "owl"
    if needs_data and calibration is None:
        why = f"method {method!r}" if pruner.calibrated else "distribution 'owl'"
        raise ValueError(f"{why} needs calibration batches; magnitude alone needs none")
    selection = spec.select(model)
    # counted before a streaming host swaps parameters in and out (a tied weight once)
    total = sum(parameter.numel() for parameter in model.parameters())
    for note in selection.notes():
        logger.info("%s", note)
    start = time.perf_counter()
    whole_model = not needs_data and host is None and compute in (None, home_device(model))
    block_sparsities: dict[int, float] = {}
    if whole_model:  # every layer at once, as torch's own pruning (global or uniform)
        masks = magnitude_masks(model, selection.names, sparsity, spec, selection.input_dims)
        masks.apply(model)
        seconds = (time.perf_counter() - start) / max(len(masks), 1)
        records = [
            _record_of(name, "magnitude", "model", sparsity, mask, seconds)
            for name, mask in masks.items()
        ]
    else:
        driver = BlockwisePruner(
            model,
            selection,
            sparsity,
            spec,
            pruner,
            device=compute,
            host=host,
            keep_masks=keep_masks,
            progress=progress,
        )
        masks = driver.run(None if calibration is None else calibration)
        by_name = {record.name: record for record in driver.records}
        records = [by_name[name] for name in selection.names]
        block_sparsities = driver.block_sparsities
    shapes = _shapes(model, selection.names)
    layers = [
        {
            "name": record.name,
            "shape": shapes[record.name],
            "sparsity": record.zeros / max(record.entries, 1),
            "target": record.target,
            "method": record.method,
            "stage": record.stage,
            "seconds": record.seconds,
        }
        for record in records
    ]
    prunable = sum(record.entries for record in records)
    pruned = sum(record.zeros for record in records)
    parameters = dict(model.named_parameters())
    widths = [
        int(parameters[name].shape[selection.input_dims.get(name, 1)])
        for name in selection.names
        if parameters[name].ndim >= 2
    ]
    caveat = rounding_caveat(sparsity, pruned / max(prunable, 1), method, spec, widths)
    return PruningReport(
        masks=masks,
        target=sparsity,
        sparsity=pruned / max(prunable, 1),
        prunable=prunable,
        pruned=pruned,
        total=total,
        excluded=dict(selection.excluded),
        notes=selection.notes(),
        method=method,
        spec=spec,
        layers=layers,
        options=pruner_options(pruner),
        block_sparsities=block_sparsities,
        caveats=[caveat] if caveat else [],
    )


def rounding_caveat(
    target: float, reached: float, method: str, spec: MaskSpec, widths: list[int]
) -> str | None:
    """Why the pruned layers' share of zeros is more than :data:`SPARSITY_SLACK` from the
    target (None when it is not): each layer prunes a whole number of weights per row
    (Wanda: ``int(in * s)``, the authors' count) or per group it thresholds, which at a few
    dozen inputs a row moves its share by up to ``1 / in``.

    Args:
        target: the sparsity asked for.
        reached: the pruned layers' share of zeros.
        method: the pruner's name.
        spec: the mask spec (N:M prunes exactly 1 - N/M: no caveat).
        widths: each pruned layer's inputs per row.
    """
    if abs(reached - target) <= SPARSITY_SLACK or spec.n_m is not None or not widths:
        return None
    narrowest = max(min(widths), 1)
    where = "in each row" if method == "wanda" else "in each group it thresholds"
    owl = ""
    if spec.distribution == "owl":
        owl = " (around OWL's block targets, whose mean is the target)"
    return (
        f"the pruned layers reached {reached:.4f}, not the target {target:g}: {method} prunes a"
        f" whole number of weights {where}{owl}, and a row of {narrowest} inputs moves a"
        f" layer's share by up to 1/{narrowest} = {1 / narrowest:.4f}"
    )


def _record_of(
    name: str, method: str, stage: str, target: float, mask: Tensor, seconds: float
) -> LayerPruned:
    entries = mask.numel()
    return LayerPruned(name, method, stage, target, entries, entries - int(mask.sum()), seconds)


def _shapes(model: nn.Module, names: list[str]) -> dict[str, list[int]]:
    parameters = dict(model.named_parameters())
    return {name: list(parameters[name].shape) for name in names}


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
