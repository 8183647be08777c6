"""Calibrated one-shot pruning (Wanda, SparseGPT), one Transformer block at a time.

As in both reference implementations, the model is pruned block by block, in order:

1. the calibration batches run through the model up to its first block, whose inputs
   (positional and keyword arguments, e.g. an attention mask) are kept;
2. for each block: its inputs run through it once while forward hooks on its prunable
   layers add up their input statistics (Wanda: the squared norm of every input feature;
   SparseGPT: ``X^T X``). Layers that read the same input tensor (q, k and v of one
   attention) share one statistic. Then every prunable layer of the block is pruned, and the
   block runs again: its pruned outputs are the next block's inputs.

So each block's statistics come from the inputs that the already-pruned blocks before it
produce, and memory holds one block's statistics at a time (plus the hidden states of the
calibration batches). Prunable layers outside the blocks (a patch projection before them,
an LM head after them, when the spec includes them) are calibrated by full forward passes,
before and after the blocks. Embedding tables and convolutions have no input matrix to
calibrate on: they are pruned by magnitude, and the report says so.

The blocks are the ``nn.ModuleList`` that holds the most prunable layers (our
``Transformer.blocks``, GPT-2's ``transformer.h``, BERT's ``encoder.layer``...). Under
``torchrun`` the statistics are summed over ranks (``all_reduce``) and rank 0's result is
broadcast, so every rank holds the same masks and weights.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from convergent.sparse.masks import Masks, check_sparsity, magnitude_masks
from convergent.sparse.selection import Selection, is_conv1d
from convergent.sparse.sparsegpt import hessian, sparsegpt_prune
from convergent.sparse.spec import MaskSpec
from convergent.sparse.wanda import input_squared_norms, wanda_mask

logger = logging.getLogger(__name__)

METHODS = ("magnitude", "wanda", "sparsegpt")
CALIBRATED = ("wanda", "sparsegpt")


def check_method(method: str, spec: MaskSpec) -> str:
    """``method`` if it is one of :data:`METHODS` and fits ``spec``, else one ValueError."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method in CALIBRATED and spec.distribution != "uniform":
        raise ValueError(
            f"{method} prunes every layer to the same sparsity; distribution "
            f"{spec.distribution!r} is for magnitude pruning only (use 'uniform')"
        )
    return method


class _StopForward(Exception):
    """Raised by a hook to end a calibration forward pass early."""


@dataclass
class LayerPruned:
    """How one weight matrix was pruned.

    Attributes:
        name: the parameter name.
        method: ``"wanda"``, ``"sparsegpt"`` or ``"magnitude"`` (layers without a calibrated
            input matrix).
        stage: the block index, ``"before"`` or ``"after"`` the blocks.
        seconds: time spent computing this layer's mask (and SparseGPT's update).
    """

    name: str
    method: str
    stage: str
    seconds: float


def find_blocks(model: nn.Module, names: Iterable[str]) -> tuple[str, nn.ModuleList] | None:
    """The ``nn.ModuleList`` (name, module) holding the most of ``names``, or None."""
    wanted = list(names)
    best: tuple[int, str, nn.ModuleList] | None = None
    for module_name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 1:
            continue
        prefix = f"{module_name}." if module_name else ""
        count = sum(name.startswith(prefix) for name in wanted)
        if count and (best is None or count > best[0]):
            best = (count, module_name, module)
    return None if best is None else (best[1], best[2])


def _owner(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _calibratable(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or is_conv1d(module)


def _as_rows(module: nn.Module, weight: Tensor) -> Tensor:
    """The weight as [out, in] (GPT-2's ``Conv1D`` stores [in, out])."""
    return weight.T if is_conv1d(module) else weight


class _Statistics:
    """Input statistics of the layers being calibrated, summed over batches.

    Layers whose inputs are the same tensor object in the first batch (q, k and v reading one
    normalized input) share one accumulator.
    """

    def __init__(self, layers: Mapping[str, nn.Module], method: str) -> None:
        self.method = method
        self.sums: dict[str, Tensor] = {}
        self.alias: dict[str, str] = {}
        # (reader, input) of each layer's first call; the tensors are held so that their
        # memory cannot be reused by a later input that would then look like the same one
        self._first_inputs: list[tuple[str, Tensor]] = []
        self._handles = [
            module.register_forward_hook(self._hook(name)) for name, module in layers.items()
        ]

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            x = inputs[0]
            if name not in self.alias:
                shared = [reader for reader, seen in self._first_inputs if seen is x]
                self.alias[name] = shared[0] if shared else name
                self._first_inputs.append((name, x))
            owner = self.alias[name]
            if owner != name:
                return  # the same input was counted by its first reader
            statistic = input_squared_norms(x) if self.method == "wanda" else hessian(x)
            if owner in self.sums:
                self.sums[owner] += statistic
            else:
                self.sums[owner] = statistic

        return hook

    def of(self, name: str) -> Tensor:
        """The summed statistic of ``name`` (over ranks too, under torchrun)."""
        owner = self.alias.get(name)
        if owner is None or owner not in self.sums:
            raise ValueError(
                f"{name} saw no calibration input: the calibration batches never reached it"
            )
        return self.sums[owner]

    def all_reduce(self) -> None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for value in self.sums.values():
                dist.all_reduce(value)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._first_inputs.clear()


@contextmanager
def _no_cache(model: nn.Module) -> Iterator[None]:
    """Switch off a ``transformers`` model's key/value cache while calibrating."""
    config = getattr(model, "config", None)
    had = getattr(config, "use_cache", None)
    if had is not None:
        config.use_cache = False  # type: ignore[union-attr]
    try:
        yield
    finally:
        if had is not None:
            config.use_cache = had  # type: ignore[union-attr]


def _model_inputs(model: nn.Module, batch: Mapping[str, Tensor], device: torch.device) -> dict:
    accepted = inspect.signature(model.forward).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    return {
        key: value.to(device)
        for key, value in batch.items()
        if key != "labels" and (takes_any or key in accepted)
    }


def _run(model: nn.Module, batches: list[dict[str, Tensor]], device: torch.device) -> None:
    for batch in batches:
        with suppress(_StopForward):
            model(**_model_inputs(model, batch, device))


def _replace_hidden(args: tuple, kwargs: dict, hidden: Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _hidden_of(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple | list) else output


class BlockwisePruner:
    """Prune ``selection``'s weights of ``model`` with a calibrated method, block by block.

    Args:
        model: the (unwrapped) model, pruned in place.
        selection: the prunable weights (``spec.select(model)``).
        sparsity: the fraction of each layer to prune, in [0, 1) (N:M prunes 1 - N/M).
        spec: the pattern (its distribution must be ``"uniform"``).
        method: ``"wanda"`` or ``"sparsegpt"``.
        options: SparseGPT's ``block_size`` and ``damping`` (see
            :func:`~convergent.sparse.sparsegpt.sparsegpt_prune`).
        progress: show a tqdm bar over the blocks (rank 0 only).
    """

    def __init__(
        self,
        model: nn.Module,
        selection: Selection,
        sparsity: float,
        spec: MaskSpec,
        method: str,
        options: Mapping[str, Any] | None = None,
        progress: bool = False,
    ) -> None:
        check_sparsity(sparsity)
        if check_method(method, spec) not in CALIBRATED:
            raise ValueError(f"method must be one of {CALIBRATED} here, got {method!r}")
        self.model = model
        self.selection = selection
        self.sparsity = sparsity
        self.spec = spec
        self.method = method
        self.options = dict(options or {})
        self.progress = progress
        modules = dict(model.named_modules())
        self.layers = {name: modules[_owner(name)] for name in selection.names}
        self.records: list[LayerPruned] = []
        self.masks: dict[str, Tensor] = {}

    def run(self, batches: Iterable[Mapping[str, Tensor]]) -> Masks:
        """Prune with the calibration ``batches`` (dicts of model inputs; ``labels`` ignored).

        Returns:
            The masks of every selected weight, in the selection's order.
        """
        calibration = [dict(batch) for batch in batches]
        if not calibration:
            raise ValueError("no calibration batches: pass at least one batch of inputs")
        device = next(self.model.parameters()).device
        uncalibrated = [n for n in self.selection.names if not _calibratable(self.layers[n])]
        for name in uncalibrated:
            self._prune_by_magnitude(name)
        calibrated = [n for n in self.selection.names if n not in uncalibrated]
        found = find_blocks(self.model, calibrated)
        modes = [(module, module.training) for module in self.model.modules()]
        self.model.eval()
        try:
            with torch.no_grad(), _no_cache(self.model):
                if found is None:
                    for name in calibrated:  # no blocks: one layer at a time, in order
                        self._calibrate_whole_model([name], calibration, device, "model")
                else:
                    prefix, blocks = found
                    inside = [n for n in calibrated if n.startswith(f"{prefix}.")]
                    outside = [n for n in calibrated if n not in inside]
                    before, after = self._split_outside(outside, blocks, calibration, device)
                    if before:
                        self._calibrate_whole_model(before, calibration, device, "before", blocks)
                    self._calibrate_blocks(prefix, blocks, inside, calibration, device)
                    if after:
                        self._calibrate_whole_model(after, calibration, device, "after")
        finally:
            for module, training in modes:  # each module's own mode, as it was
                module.training = training
        return Masks({name: self.masks[name] for name in self.selection.names})

    def _split_outside(
        self,
        outside: list[str],
        blocks: nn.ModuleList,
        calibration: list[dict[str, Tensor]],
        device: torch.device,
    ) -> tuple[list[str], list[str]]:
        """Which of the layers outside the blocks run before the first block."""
        if not outside:
            return [], []
        seen: list[str] = []
        handles = [
            self.layers[name].register_forward_hook(
                lambda *_, name=name: seen.append(name) if name not in seen else None
            )
            for name in outside
        ]

        def stop(*_: Any) -> None:
            raise _StopForward

        handles.append(blocks[0].register_forward_pre_hook(stop))
        try:
            _run(self.model, calibration[:1], device)
        finally:
            for handle in handles:
                handle.remove()
        return [n for n in outside if n in seen], [n for n in outside if n not in seen]

    def _calibrate_whole_model(
        self,
        names: list[str],
        calibration: list[dict[str, Tensor]],
        device: torch.device,
        stage: str,
        stop_before: nn.Module | None = None,
    ) -> None:
        statistics = _Statistics({name: self.layers[name] for name in names}, self.method)
        handle = None
        if stop_before is not None:

            def stop(*_: Any) -> None:
                raise _StopForward

            handle = stop_before[0].register_forward_pre_hook(stop)  # type: ignore[index]
        try:
            _run(self.model, calibration, device)
        finally:
            statistics.close()
            if handle is not None:
                handle.remove()
        self._prune_layers(names, statistics, stage)

    def _calibrate_blocks(
        self,
        prefix: str,
        blocks: nn.ModuleList,
        inside: list[str],
        calibration: list[dict[str, Tensor]],
        device: torch.device,
    ) -> None:
        inputs: list[tuple[tuple, dict]] = []

        def catch(_: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs.append((args, kwargs))
            raise _StopForward

        handle = blocks[0].register_forward_pre_hook(catch, with_kwargs=True)
        try:
            _run(self.model, calibration, device)
        finally:
            handle.remove()
        bar = tqdm(
            total=len(blocks),
            desc=f"{self.method} {self.spec.pattern}",
            unit="block",
            disable=not self.progress or (dist.is_initialized() and dist.get_rank() != 0),
        )
        for index, block in enumerate(blocks):
            names = [n for n in inside if n.startswith(f"{prefix}.{index}.")]
            if names:
                statistics = _Statistics({n: self.layers[n] for n in names}, self.method)
                try:
                    for args, kwargs in inputs:
                        block(*args, **kwargs)
                finally:
                    statistics.close()
                self._prune_layers(names, statistics, str(index))
            inputs = [
                _replace_hidden(args, kwargs, _hidden_of(block(*args, **kwargs)))
                for args, kwargs in inputs
            ]
            bar.update(1)
        bar.close()

    def _prune_layers(self, names: list[str], statistics: _Statistics, stage: str) -> None:
        statistics.all_reduce()
        for name in names:
            start = time.perf_counter()
            module = self.layers[name]
            weight = module.weight
            rows = _as_rows(module, weight.detach())
            statistic = statistics.of(name)
            if self.method == "wanda":
                mask = wanda_mask(rows, statistic, self.sparsity, self.spec.pattern)
                new = torch.where(mask, rows, torch.zeros_like(rows))
            else:
                new, mask = sparsegpt_prune(
                    rows, statistic, self.sparsity, self.spec.pattern, **self.options
                )
            mask, new = _as_rows(module, mask).contiguous(), _as_rows(module, new)
            new = _from_rank_zero(new.contiguous())
            mask = _from_rank_zero(mask.to(torch.uint8)).bool()
            weight.data.copy_(new)
            self.masks[name] = mask
            self.records.append(LayerPruned(name, self.method, stage, time.perf_counter() - start))

    def _prune_by_magnitude(self, name: str) -> None:
        """A layer without an input matrix (embedding, convolution): per-tensor magnitude."""
        start = time.perf_counter()
        masks = magnitude_masks(
            self.model, [name], self.sparsity, self.spec, self.selection.input_dims
        )
        masks.apply(self.model)
        self.masks[name] = masks[name]
        self.records.append(
            LayerPruned(name, "magnitude", "no input matrix", time.perf_counter() - start)
        )


def _from_rank_zero(tensor: Tensor) -> Tensor:
    """``tensor`` as rank 0 holds it (under torchrun; itself otherwise)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(tensor, 0)
    return tensor
