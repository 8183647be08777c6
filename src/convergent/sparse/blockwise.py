"""One-shot pruning one Transformer block at a time, on any device, in any dtype.

As in both reference implementations (locuslab/wanda, IST-DASLab/sparsegpt), the model is
pruned block by block, in order:

1. the calibration batches run through the model up to its first block, whose inputs
   (positional and keyword arguments: attention mask, rotary ``position_embeddings``...) are
   kept on the compute device;
2. for each block: it comes to the compute device (:mod:`convergent.models.placement`), its
   inputs run through it once while forward hooks on its prunable layers add up the
   pruner's statistic (:mod:`convergent.sparse.pruners`; layers that read the same input
   tensor, such as q, k and v, share one), its layers are pruned, and it runs again: its
   pruned outputs are the next block's inputs (the last block's run again only when a layer
   after the blocks is calibrated on its outputs). Then it goes home.

So each block is calibrated on what the already-pruned blocks before it produce, and memory
holds one block, its statistics (float64, whatever the weights' dtype) and the calibration
hidden states. Prunable layers outside the blocks are calibrated too: those before the first
block (a patch projection) by forward passes that stop at it, those after the last block (an
LM head) by a forward pass that replays the last block's stored outputs. Embedding tables and
convolutions have no input matrix: they are pruned by magnitude, and the report says so.

With ``MaskSpec(distribution="owl")`` a first, dense pass over the blocks gathers Wanda's
statistics, and each block's sparsity follows from its outlier ratio
(:mod:`convergent.sparse.owl`); the second pass prunes.

The blocks are the ``nn.ModuleList`` that holds the most prunable layers (our
``Transformer.blocks``, GPT-2's ``transformer.h``, Llama's ``model.layers``, BERT's
``encoder.layer``...). Under ``torchrun`` the statistics are summed over ranks (``all_reduce``)
and rank 0's result is broadcast, so every rank holds the same masks and weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from convergent.models.placement import (
    BlockHost,
    InMemoryBlocks,
    block_inputs,
    hidden_of,
    home_device,
    no_cache,
    replace_hidden,
    replaying,
    run_batches,
    stop_before,
)
from convergent.sparse.calibration import (
    LayerPruned,
    Statistics,
    as_rows,
    calibratable,
    find_blocks,
    from_rank_zero,
    owner_of,
)
from convergent.sparse.masks import Masks, check_sparsity, magnitude_masks
from convergent.sparse.owl import outlier_ratio, owl_sparsities
from convergent.sparse.pruners import Pruner
from convergent.sparse.selection import Selection
from convergent.sparse.spec import MaskSpec
from convergent.sparse.wanda import input_squared_norms, norms_from_squares

logger = logging.getLogger(__name__)

# Where the driver looks for the blocks, named in the error when none is found.
BLOCK_EXAMPLES = "model.layers, transformer.h, model.decoder.layers, encoder.layer, blocks"


class BlockwisePruner:
    """Prune ``selection``'s weights of ``model`` with ``pruner``, block by block.

    Args:
        model: the (unwrapped) model, pruned in place.
        selection: the prunable weights (``spec.select(model)``).
        sparsity: the target fraction of each layer to prune, in [0, 1) (N:M prunes 1 - N/M;
            OWL moves each block's around it).
        spec: the pattern and distribution (``"uniform"`` or ``"owl"``).
        pruner: the method (:func:`~convergent.sparse.pruners.make_pruner`).
        device: where blocks are calibrated and pruned (None: the model's own device).
        host: brings blocks to the device and home (None: :class:`InMemoryBlocks`).
        keep_masks: keep every layer's mask for :meth:`run` to return (off when streaming a
            model larger than memory: the masks are its zeros).
        progress: show a tqdm bar over the blocks (rank 0 only).
    """

    def __init__(
        self,
        model: nn.Module,
        selection: Selection,
        sparsity: float,
        spec: MaskSpec,
        pruner: Pruner,
        *,
        device: torch.device | None = None,
        host: BlockHost | None = None,
        keep_masks: bool = True,
        progress: bool = False,
    ) -> None:
        check_sparsity(sparsity)
        if spec.distribution == "global":
            raise ValueError(
                f"{pruner.name} block by block prunes every layer on its own; distribution"
                " 'global' (one threshold over all weights) is for whole-model magnitude"
                " pruning only (use 'uniform' or 'owl')"
            )
        self.model = model
        self.selection = selection
        self.sparsity = sparsity
        self.spec = spec
        self.pruner = pruner
        self.home = home_device(model)
        self.device = device if device is not None else self.home
        self.host: BlockHost = host if host is not None else InMemoryBlocks()
        self.keep_masks = keep_masks
        self.progress = progress
        modules = dict(model.named_modules())
        self.layers = {name: modules[owner_of(name)] for name in selection.names}
        self.records: list[LayerPruned] = []
        self.masks: dict[str, Tensor] = {}
        self.block_sparsities: dict[int, float] = {}
        self._warned_tokens = False

    @property
    def _needs_data(self) -> bool:
        return self.pruner.calibrated or self.spec.distribution == "owl"

    def run(self, batches: Iterable[Mapping[str, Tensor]] | None) -> Masks:
        """Prune with the calibration ``batches`` (dicts of model inputs; ``labels`` ignored;
        None for magnitude without OWL).

        Returns:
            The masks of every selected weight, in the selection's order (empty when
            ``keep_masks`` is off).
        """
        calibration = [dict(batch) for batch in batches or ()]
        if self._needs_data and not calibration:
            raise ValueError("no calibration batches: pass at least one batch of inputs")
        direct = [n for n in self.selection.names if not calibratable(self.layers[n])]
        for name in direct:
            self._prune_by_magnitude(name)
        layered = [n for n in self.selection.names if n not in direct]
        found = find_blocks(self.model, layered)
        modes = [(module, module.training) for module in self.model.modules()]
        self.model.eval()
        try:
            with torch.no_grad(), no_cache(self.model):
                if found is None:
                    self._without_blocks(layered, calibration)
                else:
                    self._with_blocks(*found, layered, calibration)
        finally:
            for module, training in modes:  # each module's own mode, as it was
                module.training = training
        if not self.keep_masks:
            return Masks({})
        return Masks({name: self.masks[name] for name in self.selection.names})

    # ---- the two layouts -------------------------------------------------------------------

    def _without_blocks(self, names: list[str], calibration: list[dict[str, Tensor]]) -> None:
        """No block list: one layer at a time, each from whole-model passes (in memory only)."""
        if self.device != self.home or not isinstance(self.host, InMemoryBlocks):
            raise ValueError(
                "found no block list to prune one block at a time: looked for the"
                f" nn.ModuleList holding the most prunable layers (such as {BLOCK_EXAMPLES});"
                " prune this model in memory on its own device instead"
            )
        if self.spec.distribution == "owl":
            raise ValueError(
                "distribution 'owl' gives each Transformer block its own sparsity, but this"
                f" model has no block list (looked for one such as {BLOCK_EXAMPLES})"
            )
        for name in names:
            if self.pruner.calibrated:
                self._calibrate_whole_model([name], calibration, "model")
            else:
                self._prune_layers([name], None, "model", self.sparsity)

    def _with_blocks(
        self,
        prefix: str,
        blocks: nn.ModuleList,
        names: list[str],
        calibration: list[dict[str, Tensor]],
    ) -> None:
        inside = [n for n in names if n.startswith(f"{prefix}.")]
        outside = [n for n in names if n not in inside]
        # The modules outside the blocks sit on the device only for the passes that run them
        # (so a streaming host need not hold a large vocabulary's embedding while blocks run).
        if self.spec.distribution == "owl":
            self._allocate_owl(prefix, blocks, inside, calibration)
        with self.host.outside(self.model, prefix, self.device):
            before, after = self._split_outside(outside, blocks, calibration)
            if before:
                self._calibrate_whole_model(before, calibration, "before", blocks[0])
        calibrated_after = bool(after) and self.pruner.calibrated
        outputs = self._prune_blocks(prefix, blocks, inside, calibration, calibrated_after)
        if after:
            with (
                self.host.outside(self.model, prefix, self.device),
                replaying(blocks, outputs) as current,
            ):
                self._calibrate_whole_model(after, calibration, "after", replay=current)

    # ---- passes ----------------------------------------------------------------------------

    def _block_inputs(
        self, prefix: str, blocks: nn.ModuleList, calibration: list[dict[str, Tensor]]
    ) -> list[tuple[tuple, dict]]:
        if not calibration:
            return []
        with self.host.outside(self.model, prefix, self.device):
            return block_inputs(self.model, blocks[0], calibration, self.device)

    def _blocks_bar(self, blocks: nn.ModuleList, what: str) -> Any:
        return tqdm(
            total=len(blocks),
            desc=what,
            unit="block",
            disable=not self.progress or (dist.is_initialized() and dist.get_rank() != 0),
        )

    def _prune_blocks(
        self,
        prefix: str,
        blocks: nn.ModuleList,
        inside: list[str],
        calibration: list[dict[str, Tensor]],
        keep_outputs: bool,
    ) -> list[Any]:
        """The pruning pass; returns the last block's outputs when ``keep_outputs``."""
        inputs = self._block_inputs(prefix, blocks, calibration) if self.pruner.calibrated else []
        outputs: list[Any] = []
        pattern = self.spec.pattern if self.spec.distribution != "owl" else "owl"
        bar = self._blocks_bar(blocks, f"{self.pruner.name} {pattern}")
        for index, block in enumerate(blocks):
            start = time.perf_counter()
            names = [n for n in inside if n.startswith(f"{prefix}.{index}.")]
            self.host.enter(index, block, self.device)
            sparsity = self.block_sparsities.get(index, self.sparsity)
            if names:
                statistics = None
                if self.pruner.calibrated:
                    statistics = Statistics(
                        {n: self.layers[n] for n in names}, self.pruner.statistic
                    )
                    try:
                        for args, kwargs in inputs:
                            block(*args, **kwargs)
                    finally:
                        statistics.close()
                self._prune_layers(names, statistics, str(index), sparsity)
            last = index == len(blocks) - 1
            # the pruned block's outputs: the next block's inputs, and the last block's only
            # when a layer after the blocks is calibrated on them (else nothing reads them)
            if inputs and (keep_outputs or not last):
                results = [block(*args, **kwargs) for args, kwargs in inputs]
                if last:
                    outputs = results
                inputs = [
                    replace_hidden(args, kwargs, hidden_of(result))
                    for (args, kwargs), result in zip(inputs, results, strict=True)
                ]
            self.host.leave(index, block, True)
            bar.update(1)
            logger.info(
                "block %d/%d: %d layers pruned%s in %.1f s",
                index + 1,
                len(blocks),
                len(names),
                f" at sparsity {sparsity:.4f}" if index in self.block_sparsities else "",
                time.perf_counter() - start,
            )
        bar.close()
        return outputs

    def _allocate_owl(
        self,
        prefix: str,
        blocks: nn.ModuleList,
        inside: list[str],
        calibration: list[dict[str, Tensor]],
    ) -> None:
        """OWL's dense pass: each block's outlier ratio from Wanda's scores, then sparsities."""
        inputs = self._block_inputs(prefix, blocks, calibration)
        ratios: list[float] = []
        sizes: list[int] = []
        indices: list[int] = []
        bar = self._blocks_bar(blocks, "OWL outlier ratios")
        for index, block in enumerate(blocks):
            names = [n for n in inside if n.startswith(f"{prefix}.{index}.")]
            self.host.enter(index, block, self.device)
            statistics = Statistics({n: self.layers[n] for n in names}, input_squared_norms)
            try:
                results = [block(*args, **kwargs) for args, kwargs in inputs]
            finally:
                statistics.close()
            if names:
                statistics.all_reduce()
                scores = []
                for name in names:
                    module = self.layers[name]
                    rows = as_rows(module, module.weight.detach())
                    norms = norms_from_squares(statistics.of(name)).to(rows.device)
                    scores.append(rows.double().abs() * norms)
                ratios.append(outlier_ratio(scores, self.spec.owl_m))
                sizes.append(sum(score.numel() for score in scores))
                indices.append(index)
            inputs = [
                replace_hidden(args, kwargs, hidden_of(result))
                for (args, kwargs), result in zip(inputs, results, strict=True)
            ]
            self.host.leave(index, block, False)
            bar.update(1)
        bar.close()
        allocation = owl_sparsities(ratios, sizes, self.sparsity, self.spec.owl_lmbda)
        self.block_sparsities = dict(zip(indices, allocation, strict=True))
        logger.info(
            "OWL (M %g, lambda %g): block sparsities from %.4f to %.4f around %.4f; outlier"
            " ratios from %.4f to %.4f",
            self.spec.owl_m,
            self.spec.owl_lmbda,
            min(allocation),
            max(allocation),
            self.sparsity,
            min(ratios),
            max(ratios),
        )

    def _split_outside(
        self,
        outside: list[str],
        blocks: nn.ModuleList,
        calibration: list[dict[str, Tensor]],
    ) -> tuple[list[str], list[str]]:
        """Which of the layers outside the blocks run before the first block."""
        if not outside:
            return [], []
        if not calibration:  # magnitude without data: the order does not matter
            return outside, []
        seen: list[str] = []
        handles = [
            self.layers[name].register_forward_hook(
                lambda *_, name=name: seen.append(name) if name not in seen else None
            )
            for name in outside
        ]
        try:
            with stop_before(blocks[0]):
                run_batches(self.model, calibration[:1], self.device)
        finally:
            for handle in handles:
                handle.remove()
        return [n for n in outside if n in seen], [n for n in outside if n not in seen]

    def _calibrate_whole_model(
        self,
        names: list[str],
        calibration: list[dict[str, Tensor]],
        stage: str,
        stop_at: nn.Module | None = None,
        replay: list[int] | None = None,
    ) -> None:
        if not self.pruner.calibrated:
            self._prune_layers(names, None, stage, self.sparsity)
            return
        statistics = Statistics({name: self.layers[name] for name in names}, self.pruner.statistic)
        try:
            with stop_before(stop_at) if stop_at is not None else nullcontext():
                for index, batch in enumerate(calibration):
                    if replay is not None:
                        replay[0] = index
                    run_batches(self.model, [batch], self.device)
        finally:
            statistics.close()
        self._prune_layers(names, statistics, stage, self.sparsity)

    # ---- one layer -------------------------------------------------------------------------

    def _prune_layers(
        self, names: list[str], statistics: Statistics | None, stage: str, sparsity: float
    ) -> None:
        if statistics is not None:
            statistics.all_reduce()
        for name in names:
            start = time.perf_counter()
            module = self.layers[name]
            weight = module.weight
            rows = as_rows(module, weight.detach())
            statistic = rows.new_zeros(0) if statistics is None else statistics.of(name)
            if statistics is not None:
                self._warn_if_few_tokens(name, statistics.tokens_of(name), rows.shape[1])
            try:
                consume = statistics is not None and statistics.last_reader(name)
                new, mask = self.pruner.prune(rows, statistic, sparsity, self.spec.n_m, consume)
            except ValueError as error:
                raise ValueError(f"{self.pruner.name} could not prune {name}: {error}") from None
            mask, new = as_rows(module, mask).contiguous(), as_rows(module, new)
            new = from_rank_zero(new.contiguous())
            mask = from_rank_zero(mask.to(torch.uint8)).bool()
            weight.data.copy_(new)
            if statistics is not None:
                statistics.release(name)
            if self.keep_masks:
                self.masks[name] = mask.to(self.home)
            self._record(name, self.pruner.name, stage, sparsity, mask, start)

    def _warn_if_few_tokens(self, name: str, tokens: int, inputs: int) -> None:
        if self.pruner.name == "sparsegpt" and tokens < inputs and not self._warned_tokens:
            self._warned_tokens = True
            logger.warning(
                "%s saw %d calibration tokens for its %d inputs, so SparseGPT's Hessian is"
                " singular and rests on its damping; calibrate on more examples",
                name,
                tokens,
                inputs,
            )

    def _record(
        self, name: str, method: str, stage: str, target: float, mask: Tensor, start: float
    ) -> None:
        entries = mask.numel()
        # count_nonzero: a bool tensor's sum widens it to int64 first (48 MiB at a 1536 x 4096
        # layer, the streamed prune's peak with float32 statistics)
        zeros = entries - int(torch.count_nonzero(mask))
        self.records.append(
            LayerPruned(name, method, stage, target, entries, zeros, time.perf_counter() - start)
        )

    def _prune_by_magnitude(self, name: str) -> None:
        """A layer without an input matrix (embedding, convolution): per-tensor magnitude."""
        start = time.perf_counter()
        masks = magnitude_masks(
            self.model,
            [name],
            self.sparsity,
            self.spec.replace(distribution="uniform"),
            self.selection.input_dims,
        )
        masks.apply(self.model)
        if self.keep_masks:
            self.masks[name] = masks[name]
        self._record(name, "magnitude", "no input matrix", self.sparsity, masks[name], start)
