"""A Hugging Face model whose weights stay in its files until a block needs them.

For models larger than memory. The model is built from its config with accelerate's
``init_empty_weights`` (every parameter on the ``meta`` device, so nothing is allocated); the
modules outside the Transformer blocks (embeddings, final norm, head) are then read from the
folder's files, and each block is read only when :meth:`StreamedBlocks.enter` asks for it, and
dropped again by :meth:`StreamedBlocks.leave` (after it is written out, when a writer is given).
The outside modules are read when a pass needs them (:meth:`StreamedBlocks.outside`: the
forward passes up to the first block, the head after the last) and dropped after, unless they
were loaded for the whole run (:meth:`StreamedModel.load_outside`, when pruning changes them).
So memory holds one block, or the outside modules, whatever the model's size::

    streamed = StreamedModel(folder, AutoModelForCausalLM, dtype=torch.bfloat16)
    host = StreamedBlocks(streamed, "model.layers", DenseShards(staging))  # a BlockHost
    prune_one_shot(streamed.model, 0.5, method="sparsegpt", calibration=batches, host=host,
                   keep_masks=False)
    host.finish()                                          # the outside modules, the index

Tensors come from a reader (:class:`SafetensorsReader`: safetensors' lazy ``safe_open``, one
tensor at a time) and go to a shard writer, one shard per block and one for the rest
(:class:`DenseShards` writes a sharded ``save_pretrained`` folder;
:class:`convergent.sparse.storage.CompressedShards` compressed shards, with
:class:`~convergent.sparse.storage.CompressedReader` to read them back).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from convergent.io import make_readable
from convergent.models.placement import outside_on

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# safetensors' dtype names of the floating types a model is stored in.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
}


class StreamedModelError(ValueError):
    """A folder that cannot be streamed as asked."""


class TensorReader(Protocol):
    """Where a streamed model's stored tensors come from."""

    def names(self) -> set[str]:
        """Every stored tensor's name."""
        ...

    def read(self, names: list[str]) -> dict[str, Tensor]:
        """The stored tensors ``names``, on the CPU, in their stored dtypes."""
        ...


class ShardWriter(Protocol):
    """Where a streamed model's pruned tensors go, one shard at a time."""

    def write(self, shard: int, shards: int, state: dict[str, Tensor]) -> None:
        """Write shard number ``shard`` (from 1) of ``shards``."""
        ...

    def close(self) -> None:
        """Write what ties the shards together (an index), after the last one."""
        ...


class SafetensorsReader:
    """A ``save_pretrained`` folder's safetensors weights (one file, or shards and an index),
    read lazily with ``safe_open``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.files = _weight_files(self.folder)

    def names(self) -> set[str]:
        return set(self.files)

    def read(self, names: list[str]) -> dict[str, Tensor]:
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        tensors: dict[str, Tensor] = {}
        for path, group in by_file.items():
            with safe_open(str(path), framework="pt") as handle:
                for name in group:
                    tensors[name] = handle.get_tensor(name)
        return tensors

    def stored_dtype(self) -> torch.dtype:
        """The dtype of the first stored tensor (the folder's dtype)."""
        from safetensors import safe_open

        name, path = next(iter(self.files.items()))
        with safe_open(str(path), framework="pt") as handle:
            code = handle.get_slice(name).get_dtype()
        if code not in SAFETENSORS_DTYPES:
            raise StreamedModelError(
                f"{self.folder} stores {name} as {code}; pass a dtype (float32, bfloat16 or"
                " float16) to load it in"
            )
        return SAFETENSORS_DTYPES[code]


def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it, from a folder's index or single file."""
    index = folder / INDEX_FILE
    if index.is_file():
        mapping = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in mapping.items()}
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise StreamedModelError(
            f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}: streaming needs a"
            " save_pretrained folder with safetensors weights"
        )
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return {name: single for name in handle.keys()}  # noqa: SIM118 (not a dict)


class StreamedModel:
    """A ``transformers`` model built empty from ``folder``'s config, read tensor by tensor.

    Args:
        folder: a ``save_pretrained`` folder with safetensors weights.
        auto_class: the ``transformers`` auto class to build it with (e.g.
            ``AutoModelForCausalLM``).
        dtype: the dtype to compute in (None: the folder's own, as ``from_pretrained``).

    Attributes:
        reader: where tensors are read from (a :class:`SafetensorsReader` of ``folder``; point
            it elsewhere, e.g. at the pruned shards, to read those).
    """

    def __init__(self, folder: str | Path, auto_class: Any, dtype: torch.dtype | None = None):
        from accelerate import init_empty_weights
        from transformers import AutoConfig

        self.folder = Path(folder)
        files = SafetensorsReader(self.folder)
        self.reader: TensorReader = files
        config = AutoConfig.from_pretrained(self.folder, local_files_only=True)
        self.dtype = dtype or files.stored_dtype()
        with init_empty_weights():
            self.model: nn.Module = auto_class.from_config(config, dtype=self.dtype)
        # from_config leaves the tie to from_pretrained: tie now, so that a tied LM head is
        # one parameter (pruned, counted and left dense once, as in memory)
        self._tie()
        self.model.eval()

    def _tie(self) -> None:
        tie = getattr(self.model, "tie_weights", None)
        if callable(tie):
            tie()

    def read(self, names: list[str]) -> dict[str, Tensor]:
        """The stored tensors ``names``, in :attr:`dtype` (floating ones), on the CPU."""
        stored = self.reader.names()
        missing = [name for name in names if name not in stored]
        if missing:
            raise StreamedModelError(
                f"the weights of {self.folder} have no tensor {missing[0]!r}"
                f" ({len(missing)} missing): the files do not match the config's model"
            )
        return {
            name: tensor.to(self.dtype) if tensor.is_floating_point() else tensor
            for name, tensor in self.reader.read(names).items()
        }

    def load(self, prefix: str, module: nn.Module, device: torch.device | str) -> None:
        """Read ``module``'s (at ``prefix``) stored parameters (and stored buffers) onto
        ``device``; its other buffers (rotary tables, masks) move there."""
        from accelerate.utils import set_module_tensor_to_device

        names = [name for name, _ in module.named_parameters()]
        buffers = [name for name, _ in module.named_buffers()]
        stored_names = self.reader.names()
        stored = self.read(
            [_joined(prefix, name) for name in names]
            + [_joined(prefix, name) for name in buffers if _joined(prefix, name) in stored_names]
        )
        for name in names + buffers:
            value = stored.get(_joined(prefix, name))
            set_module_tensor_to_device(module, name, device, value=value)

    def load_outside(self, block_prefix: str) -> None:
        """Read every parameter outside the block list at ``block_prefix`` (CPU), then tie the
        model's weights again (an untied copy would be written twice)."""
        from accelerate.utils import set_module_tensor_to_device

        outside = [
            name
            for name, _ in self.model.named_parameters(remove_duplicate=False)
            if not name.startswith(f"{block_prefix}.")
        ]
        # A tied weight (GPT-2's LM head) is stored once, under its other name.
        stored_names = self.reader.names()
        stored = self.read([name for name in outside if name in stored_names])
        for name, value in stored.items():
            set_module_tensor_to_device(self.model, name, "cpu", value=value)
        self._tie()
        empty = [
            name
            for name, parameter in self.model.named_parameters()
            if not name.startswith(f"{block_prefix}.") and parameter.device.type == "meta"
        ]
        if empty:
            raise StreamedModelError(
                f"the weights of {self.folder} have no tensor {empty[0]!r} (nor a weight it is"
                " tied to): the files do not match the config's model"
            )

    def outside_loaded(self, block_prefix: str) -> bool:
        """Whether every parameter outside the block list at ``block_prefix`` holds data."""
        return all(
            parameter.device.type != "meta"
            for name, parameter in self.model.named_parameters()
            if not name.startswith(f"{block_prefix}.")
        )

    def drop_outside(self, block_prefix: str) -> None:
        """Drop every parameter outside the block list at ``block_prefix`` back to ``meta``
        (under each of its names: a tied weight is freed only once no module holds it)."""
        from accelerate.utils import set_module_tensor_to_device

        for name, _ in list(self.model.named_parameters(remove_duplicate=False)):
            if not name.startswith(f"{block_prefix}."):
                set_module_tensor_to_device(self.model, name, "meta")
        self._tie()  # each name got its own meta tensor: one parameter again


def _joined(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def release_freed_memory() -> None:
    """Return the C allocator's free pages to the system (glibc's ``malloc_trim``; nothing
    elsewhere). glibc keeps what is freed in its heaps (its mmap threshold rises to the size of
    each large block freed, up to 32 MiB, so later tensors of that size come from the heaps),
    and a streamed run's resident size then grew with the number of blocks."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# glibc's M_MMAP_THRESHOLD (malloc.h) and the size above which a streamed run's allocations
# get their own mappings (benchmarks/README.md: 1 MiB kept the peak flat from 2 to 8 blocks).
M_MMAP_THRESHOLD = -3
STREAMED_MMAP_THRESHOLD = 1 << 20


def map_large_allocations() -> None:
    """Give every C allocation above `STREAMED_MMAP_THRESHOLD` its own memory mapping, which is
    returned to the system when freed (glibc's ``mallopt(M_MMAP_THRESHOLD, ...)``; nothing
    elsewhere). By default glibc raises that threshold to the size of each large block freed,
    up to 32 MiB, and later tensors of that size come from its heaps and stay resident: a
    streamed run's peak grew with the number of blocks. The setting is the process's from then
    on (a fixed threshold; large temporaries are mapped afresh, which costs some time)."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, STREAMED_MMAP_THRESHOLD)


@functools.cache
def _mallopt() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return None


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def to_meta(module: nn.Module) -> None:
    """Drop ``module``'s parameters back to the ``meta`` device (their memory is freed); its
    buffers stay (the next :meth:`StreamedModel.load` moves them where they are needed)."""
    from accelerate.utils import set_module_tensor_to_device

    for name, _ in list(module.named_parameters()):
        set_module_tensor_to_device(module, name, "meta")


class DenseShards:
    """Writes a sharded ``save_pretrained`` folder: ``model-0000i-of-0000N.safetensors`` and
    ``model.safetensors.index.json``, each file written atomically."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.weight_map: dict[str, str] = {}

    def write(self, shard: int, shards: int, state: dict[str, Tensor]) -> None:
        from safetensors.torch import save_file

        file = f"model-{shard:05d}-of-{shards:05d}.safetensors"
        tensors: dict[str, Tensor] = {}
        storages: set[int] = set()
        for name, tensor in state.items():  # a tied weight once, as save_pretrained does
            storage = tensor.untyped_storage().data_ptr()
            if storage not in storages:
                storages.add(storage)
                tensors[name] = tensor.to("cpu").contiguous()
        partial = self.folder / f".{file}.partial"
        save_file(tensors, str(partial), metadata={"format": "pt"})
        make_readable(partial)
        os.replace(partial, self.folder / file)
        self.weight_map.update(dict.fromkeys(tensors, file))

    def close(self) -> None:
        index = {"metadata": {}, "weight_map": dict(sorted(self.weight_map.items()))}
        partial = self.folder / f".{INDEX_FILE}.partial"
        partial.write_text(json.dumps(index, indent=2) + "\n")
        os.replace(partial, self.folder / INDEX_FILE)


class StreamedBlocks:
    """A block host (:class:`convergent.models.placement.BlockHost`) over a
    :class:`StreamedModel`: each block is read when it is needed and dropped after; with a
    ``writer``, each pruned block is first written as one shard.

    Args:
        streamed: the model (its modules outside the blocks already loaded).
        prefix: the name of its block list (e.g. ``model.layers``).
        writer: where the pruned blocks go (None: nothing is written).
    """

    def __init__(
        self, streamed: StreamedModel, prefix: str, writer: ShardWriter | None = None
    ) -> None:
        self.streamed = streamed
        self.prefix = prefix
        self.writer = writer
        blocks = streamed.model.get_submodule(prefix)
        self.count = len(blocks)  # type: ignore[arg-type]

    def enter(self, index: int, block: nn.Module, device: torch.device) -> None:
        self.streamed.load(f"{self.prefix}.{index}", block, device)

    def leave(self, index: int, block: nn.Module, pruned: bool) -> None:
        if pruned and self.writer is not None:
            prefix = f"{self.prefix}.{index}."
            state = block.state_dict(prefix=prefix)  # parameters and persistent buffers
            self.writer.write(index + 1, self.count + 1, {k: v.to("cpu") for k, v in state.items()})
        to_meta(block)
        release_freed_memory()

    @contextmanager
    def outside(self, model: nn.Module, prefix: str, device: torch.device) -> Iterator[None]:
        """The modules outside the blocks sit on ``device``; read from the files first when
        they are not in memory, and dropped again after (so a large vocabulary's embedding is
        not held while the blocks run). Loaded ones (:meth:`StreamedModel.load_outside`, for
        a run that prunes them) stay."""
        loaded_here = not self.streamed.outside_loaded(prefix)
        if loaded_here:
            self.streamed.load_outside(prefix)
        try:
            with outside_on(model, prefix, device):
                yield
        finally:
            if loaded_here:
                self.streamed.drop_outside(prefix)

    def finish(self) -> None:
        """Write the modules outside the blocks as the last shard, then the index."""
        if self.writer is None:
            return
        model = self.streamed.model
        with self.outside(model, self.prefix, torch.device("cpu")):
            state = {
                name: value
                for name, value in model.state_dict().items()
                if not name.startswith(f"{self.prefix}.")
            }  # a tied weight under each of its names: the writer stores it once
            self.writer.write(self.count + 1, self.count + 1, state)
            del state
        self.writer.close()
