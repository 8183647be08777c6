"""What the block-by-block driver records and gathers: each pruned layer's record, the blocks,
the layers' input statistics summed over batches (and ranks), and rank 0's result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from convergent.sparse.selection import is_conv1d


@dataclass
class LayerPruned:
    """How one weight matrix was pruned.

    Attributes:
        name: the parameter name.
        method: the pruner's name (``"magnitude"`` for layers without an input matrix).
        stage: the block index, ``"before"`` or ``"after"`` the blocks, or ``"model"``.
        target: the sparsity asked of this layer (OWL's block sparsity, or the target).
        entries: the weight's number of entries.
        zeros: its entries that are zero after pruning.
        seconds: time spent computing this layer's mask (and SparseGPT's update).
    """

    name: str
    method: str
    stage: str
    target: float
    entries: int
    zeros: int
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


def owner_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def calibratable(module: nn.Module) -> bool:
    """A layer with an input matrix: ``nn.Linear`` or GPT-2's ``Conv1D``."""
    return isinstance(module, nn.Linear) or is_conv1d(module)


def as_rows(module: nn.Module, weight: Tensor) -> Tensor:
    """The weight as [out, in] (GPT-2's ``Conv1D`` stores [in, out])."""
    return weight.T if is_conv1d(module) else weight


class Statistics:
    """Input statistics of the layers being calibrated, summed over batches.

    Layers whose inputs are the same tensor object in the first batch (q, k and v reading one
    normalized input) share one accumulator; each batch's statistic is added into it in place
    (``statistic(inputs, total=...)``: SparseGPT's never makes a second ``[in, in]`` matrix).
    """

    def __init__(self, layers: Mapping[str, nn.Module], statistic: Any) -> None:
        self.statistic = statistic
        self.sums: dict[str, Tensor] = {}
        self.tokens: dict[str, int] = {}
        self.alias: dict[str, str] = {}
        # (reader, input) of each layer's first call; the tensors are held so that their
        # memory cannot be reused by a later input that would then look like the same one
        self._first_inputs: list[tuple[str, Tensor]] = []
        self._released: set[str] = set()
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
            self.sums[owner] = self.statistic(x, total=self.sums.get(owner))
            self.tokens[owner] = self.tokens.get(owner, 0) + x.numel() // max(x.shape[-1], 1)

        return hook

    def of(self, name: str) -> Tensor:
        """The summed statistic of ``name`` (over ranks too, under torchrun)."""
        owner = self.alias.get(name)
        if owner is None or owner not in self.sums:
            raise ValueError(
                f"{name} saw no calibration input: the calibration batches never reached it"
            )
        return self.sums[owner]

    def last_reader(self, name: str) -> bool:
        """Whether ``name`` is the last unreleased reader of its summed statistic (so that
        pruning it may overwrite the statistic, which :meth:`release` then drops)."""
        owner = self.alias.get(name)
        others = [reader for reader in self._readers(owner) if reader != name]
        return owner is not None and all(reader in self._released for reader in others)

    def _readers(self, owner: str | None) -> list[str]:
        """The layers that read the summed statistic of ``owner``."""
        return [reader for reader, shared in self.alias.items() if shared == owner]

    def release(self, name: str) -> None:
        """``name`` is pruned: drop the summed statistic it reads once every layer sharing it
        is released (a block's largest Hessian is then the only one left when it is used)."""
        self._released.add(name)
        owner = self.alias.get(name)
        if owner is not None and all(reader in self._released for reader in self._readers(owner)):
            self.sums.pop(owner, None)

    def tokens_of(self, name: str) -> int:
        return self.tokens.get(self.alias.get(name, name), 0)

    def all_reduce(self) -> None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for value in self.sums.values():
                dist.all_reduce(value)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._first_inputs.clear()


def from_rank_zero(tensor: Tensor) -> Tensor:
    """``tensor`` as rank 0 holds it (under torchrun; itself otherwise)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(tensor, 0)
    return tensor
