"""A Hugging Face model whose weights stay in its safetensors files until a block needs them.

For models larger than memory. The model is built from its config with accelerate's
``init_empty_weights`` (every parameter on the ``meta`` device, so nothing is allocated); the
modules outside the Transformer blocks (embeddings, final norm, head) are then read from the
folder's safetensors files, and each block is read, with safetensors' lazy ``safe_open``, only
when :meth:`StreamedBlocks.enter` asks for it, and dropped again by :meth:`StreamedBlocks.leave`
(after writing it to an output folder, when one is given). So memory holds the outside modules
and one block, whatever the model's size::

    streamed = StreamedModel(folder, AutoModelForCausalLM, dtype=torch.bfloat16)
    streamed.load_outside("model.layers")                  # embeddings, final norm, head
    host = StreamedBlocks(streamed, "model.layers", write_to=staging)  # a BlockHost
    prune_one_shot(streamed.model, 0.5, method="sparsegpt", calibration=batches, host=host,
                   keep_masks=False)
    host.finish()                                          # the outside modules, the index

The files written are a sharded ``save_pretrained`` folder's (``model-00001-of-000NN.safetensors``
and ``model.safetensors.index.json``): one shard per block, and one for the rest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

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


def weight_files(folder: Path) -> dict[str, Path]:
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
    """

    def __init__(self, folder: str | Path, auto_class: Any, dtype: torch.dtype | None = None):
        from accelerate import init_empty_weights
        from transformers import AutoConfig

        self.folder = Path(folder)
        self.files = weight_files(self.folder)
        config = AutoConfig.from_pretrained(self.folder, local_files_only=True)
        self.dtype = dtype or self._stored_dtype()
        with init_empty_weights():
            self.model: nn.Module = auto_class.from_config(config, dtype=self.dtype)
        self.model.eval()

    def _stored_dtype(self) -> torch.dtype:
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

    def read(self, names: list[str]) -> dict[str, Tensor]:
        """The stored tensors ``names``, in :attr:`dtype` (floating ones), on the CPU."""
        from safetensors import safe_open

        missing = [name for name in names if name not in self.files]
        if missing:
            raise StreamedModelError(
                f"the weights of {self.folder} have no tensor {missing[0]!r}"
                f" ({len(missing)} missing): the files do not match the config's model"
            )
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        tensors: dict[str, Tensor] = {}
        for path, group in by_file.items():
            with safe_open(str(path), framework="pt") as handle:
                for name in group:
                    tensor = handle.get_tensor(name)
                    tensors[name] = tensor.to(self.dtype) if tensor.is_floating_point() else tensor
        return tensors

    def load(self, prefix: str, module: nn.Module, device: torch.device | str) -> None:
        """Read ``module``'s (at ``prefix``) stored parameters (and stored buffers) onto
        ``device``; its other buffers (rotary tables, masks) move there."""
        from accelerate.utils import set_module_tensor_to_device

        names = [name for name, _ in module.named_parameters()]
        buffers = [name for name, _ in module.named_buffers()]
        stored = self.read(
            [_joined(prefix, name) for name in names]
            + [_joined(prefix, name) for name in buffers if _joined(prefix, name) in self.files]
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
        stored = self.read([name for name in outside if name in self.files])
        for name, value in stored.items():
            set_module_tensor_to_device(self.model, name, "cpu", value=value)
        tie = getattr(self.model, "tie_weights", None)
        if callable(tie):
            tie()
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


def _joined(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _tied_names(model: nn.Module) -> set[str]:
    """Names of parameters that are a second name of an earlier one (a tied LM head)."""
    seen: set[int] = set()
    tied: set[str] = set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            tied.add(name)
        seen.add(id(parameter))
    return tied


def to_meta(module: nn.Module) -> None:
    """Drop ``module``'s parameters back to the ``meta`` device (their memory is freed); its
    buffers stay (the next :meth:`StreamedModel.load` moves them where they are needed)."""
    from accelerate.utils import set_module_tensor_to_device

    for name, _ in list(module.named_parameters()):
        set_module_tensor_to_device(module, name, "meta")


class StreamedBlocks:
    """A block host (:class:`convergent.sparse.placement.BlockHost`) over a
    :class:`StreamedModel`: each block is read from the files when it is needed and dropped
    after; with ``write_to``, each pruned block is first written there as one shard.

    Args:
        streamed: the model.
        prefix: the name of its block list (e.g. ``model.layers``).
        write_to: a folder for the pruned model's weights (None: nothing is written).
        encode: turns a shard's tensors into what is stored (e.g. a compressed encoding);
            returns (tensors, metadata); None stores them as they are.
    """

    def __init__(
        self,
        streamed: StreamedModel,
        prefix: str,
        write_to: str | Path | None = None,
        encode: Any = None,
    ) -> None:
        self.streamed = streamed
        self.prefix = prefix
        self.write_to = None if write_to is None else Path(write_to)
        self.encode = encode
        self.shards: dict[str, str] = {}  # tensor name -> shard file
        blocks = streamed.model.get_submodule(prefix)
        self.count = len(blocks)  # type: ignore[arg-type]

    def enter(self, index: int, block: nn.Module, device: torch.device) -> None:
        self.streamed.load(f"{self.prefix}.{index}", block, device)

    def leave(self, index: int, block: nn.Module, pruned: bool) -> None:
        if pruned and self.write_to is not None:
            state = {
                f"{self.prefix}.{index}.{name}": parameter.detach()
                for name, parameter in block.named_parameters()
            }
            self._write(self._shard_name(index), state)
        to_meta(block)

    def outside(self, model: nn.Module, prefix: str, device: torch.device) -> Any:
        return outside_on(model, prefix, device)

    def _shard_name(self, index: int) -> str:
        return f"model-{index + 1:05d}-of-{self.count + 1:05d}.safetensors"

    def _write(self, file: str, state: dict[str, Tensor]) -> None:
        from safetensors.torch import save_file

        assert self.write_to is not None
        tensors = {name: tensor.to("cpu").contiguous() for name, tensor in state.items()}
        metadata: dict[str, str] = {"format": "pt"}
        if self.encode is not None:
            tensors, extra = self.encode(tensors)
            metadata.update(extra)
        partial = self.write_to / f".{file}.partial"
        save_file(tensors, str(partial), metadata=metadata)
        os.replace(partial, self.write_to / file)
        for name in state:
            self.shards[name] = file

    def finish(self) -> None:
        """Write the modules outside the blocks and the index (after the last block)."""
        if self.write_to is None:
            return
        model = self.streamed.model
        tied = _tied_names(model)
        state = {
            name: parameter.detach()
            for name, parameter in model.named_parameters(remove_duplicate=False)
            if not name.startswith(f"{self.prefix}.") and name not in tied
        }
        self._write(f"model-{self.count + 1:05d}-of-{self.count + 1:05d}.safetensors", state)
        index = {"metadata": {}, "weight_map": dict(sorted(self.shards.items()))}
        partial = self.write_to / f".{INDEX_FILE}.partial"
        partial.write_text(json.dumps(index, indent=2) + "\n")
        os.replace(partial, self.write_to / INDEX_FILE)
