"""Where a model's parts sit while it is pruned block by block: the compute device and home.

The model stays where it was loaded (its *home*: CPU memory, or, streamed from its files, no
memory at all). The block-by-block driver asks a :class:`BlockHost` to bring one block at a time
to the compute device and to send it back; the modules outside the blocks (embeddings, final
norm, head) sit on the compute device for the passes that run them (:meth:`BlockHost.outside`:
up to the first block, and after the last), not while the blocks run. :class:`InMemoryBlocks` is the host of a model held in
memory; a host that streams blocks from safetensors files is
:class:`convergent.models.streamed.StreamedBlocks`. Used by the one-shot pruners
(:mod:`convergent.sparse.blockwise`) and by block-by-block evaluation.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from convergent.wording import option


class BlockHost(Protocol):
    """Brings blocks to the compute device and back (see the module docstring)."""

    def enter(self, index: int, block: nn.Module, device: torch.device) -> None:
        """Make ``block`` (number ``index``) ready to run on ``device``."""
        ...

    def leave(self, index: int, block: nn.Module, pruned: bool) -> None:
        """Send ``block`` home; ``pruned``: its pruning is done (its weights are final)."""
        ...

    def outside(self, model: nn.Module, prefix: str, device: torch.device) -> Any:
        """A context manager: the modules outside the blocks at ``prefix`` sit on ``device``."""
        ...


def home_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter that holds data (CPU for an empty model)."""
    for parameter in model.parameters():
        if parameter.device.type != "meta":
            return parameter.device
    return torch.device("cpu")


def _move_own_tensors(module: nn.Module, device: torch.device) -> None:
    """Move ``module``'s own parameters and buffers (not its children's), keeping identities
    (a tied weight is one Parameter object, moved once)."""
    for parameter in module.parameters(recurse=False):
        if parameter.device != device:
            parameter.data = parameter.data.to(device)
    for name, buffer in list(module.named_buffers(recurse=False)):
        if buffer is not None and buffer.device != device:
            setattr(module, name, buffer.to(device))


def outside_modules(model: nn.Module, prefix: str) -> list[nn.Module]:
    """The modules of ``model`` that are neither the block list at ``prefix`` nor inside it."""
    return [
        module
        for name, module in model.named_modules()
        if name != prefix and not name.startswith(f"{prefix}.")
    ]


class InMemoryBlocks:
    """The host of a model held in memory: blocks go to the device and back with ``.to``."""

    def __init__(self) -> None:
        self._homes: dict[int, torch.device] = {}

    def enter(self, index: int, block: nn.Module, device: torch.device) -> None:
        home = home_device(block)
        if home != device:
            self._homes[index] = home
            block.to(device)

    def leave(self, index: int, block: nn.Module, pruned: bool) -> None:
        home = self._homes.pop(index, None)
        if home is not None:
            block.to(home)

    def outside(self, model: nn.Module, prefix: str, device: torch.device) -> Any:
        return outside_on(model, prefix, device)


@contextmanager
def outside_on(model: nn.Module, prefix: str, device: torch.device) -> Iterator[None]:
    """The modules outside the block list at ``prefix`` sit on ``device``, then go home."""
    homes = [(module, home_device(module)) for module in outside_modules(model, prefix)]
    moved = [(module, home) for module, home in homes if _holds_tensors(module)]
    for module, _ in moved:
        _move_own_tensors(module, device)
    try:
        yield
    finally:
        for module, home in moved:
            _move_own_tensors(module, home)


def _holds_tensors(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside (tuples, lists, dicts) moved to ``device``."""
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, tuple | list):
        return type(value)(to_device(item, device) for item in value)
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value


def check_device(device: str | torch.device | None, dtype: torch.dtype | None = None) -> Any:
    """``device`` as a ``torch.device`` (None stays None), checked to exist here and, with
    ``dtype``, to multiply in it; anything else is one ValueError sentence."""
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"{option('device')} must be cpu, cuda or cuda:N, got {device!r} ({error})"
        ) from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{option('device', str(device))} was asked for, but this machine has no CUDA"
            )
        index = resolved.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"{option('device', str(device))} does not exist: this machine has"
                f" {torch.cuda.device_count()} CUDA device(s)"
            )
    elif resolved.type not in ("cpu", "mps", "xpu"):
        raise ValueError(f"{option('device')} must be cpu, cuda or cuda:N, got {str(device)!r}")
    if dtype is not None:
        check_dtype_on(resolved, dtype)
    return resolved


def check_dtype_on(device: torch.device, dtype: torch.dtype) -> None:
    """One ValueError sentence when ``device`` cannot multiply matrices in ``dtype``."""
    try:
        probe = torch.ones(2, 2, dtype=dtype, device=device)
        (probe @ probe).sum().item()
    except (RuntimeError, TypeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"{option('dtype', str(dtype).removeprefix('torch.'))} cannot be computed on"
            f" {device} ({reason}); choose float32"
        ) from None


@contextmanager
def replaying(blocks: nn.ModuleList, outputs: list[Any]) -> Iterator[list[int]]:
    """Every block returns the stored ``outputs[i]`` of the batch ``i`` being run.

    So a whole-model forward reaches the layers after the blocks with the last block's stored
    outputs, without the blocks' weights (which may be elsewhere, or not loaded at all). The
    blocks keep their attributes (some models read e.g. ``layer.attention_type``): only their
    ``forward`` is replaced, and restored after. Yields a one-item list: set its item to the
    index of the batch about to run.
    """
    current = [0]

    def forward(*args: Any, **kwargs: Any) -> Any:
        return outputs[current[0]]

    saved = [block.__dict__.get("forward") for block in blocks]
    for block in blocks:
        block.forward = forward
    try:
        yield current
    finally:
        for block, original in zip(blocks, saved, strict=True):
            if original is None:
                del block.forward
            else:
                block.forward = original


class StopForward(Exception):
    """Raised by a hook to end a forward pass early."""


@contextmanager
def no_cache(model: nn.Module) -> Iterator[None]:
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


def model_inputs(model: nn.Module, batch: Mapping[str, Tensor], device: torch.device) -> dict:
    accepted = inspect.signature(model.forward).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    return {
        key: value.to(device)
        for key, value in batch.items()
        if key != "labels" and (takes_any or key in accepted)
    }


def run_batches(model: nn.Module, batches: list[dict[str, Tensor]], device: torch.device) -> None:
    for batch in batches:
        with suppress(StopForward):
            model(**model_inputs(model, batch, device))


def replace_hidden(args: tuple, kwargs: dict, hidden: Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def hidden_of(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple | list) else output


@contextmanager
def stop_before(block: nn.Module, catch: list[tuple[tuple, dict]] | None = None) -> Iterator[None]:
    """End forward passes at ``block``'s input, keeping its inputs in ``catch`` if given."""

    def stop(_: nn.Module, args: tuple, kwargs: dict) -> None:
        if catch is not None:
            catch.append((args, kwargs))
        raise StopForward

    handle = block.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def block_inputs(
    model: nn.Module, first: nn.Module, batches: list[dict[str, Tensor]], device: torch.device
) -> list[tuple[tuple, dict]]:
    """The (args, kwargs) that the first block ``first`` receives for each batch, on
    ``device`` (the modules before it must be there)."""
    inputs: list[tuple[tuple, dict]] = []
    with stop_before(first, inputs):
        run_batches(model, batches, device)
    return inputs


def forward_block_by_block(
    model: nn.Module,
    prefix: str,
    batches: list[dict[str, Tensor]],
    device: torch.device,
    host: BlockHost | None = None,
) -> Iterator[Any]:
    """The model's output for each of ``batches``, computed one block at a time over all.

    Each block comes to ``device`` once (from memory, or from its files with a streaming
    host), runs every batch's hidden states, and goes home; then the modules after the blocks
    run on the last block's stored outputs, one batch at a time (each output is yielded before
    the next is computed, so a large vocabulary's logits are never all held). So a model larger
    than memory is evaluated with one block in memory.

    Args:
        model: the model (in eval mode).
        prefix: the name of its block list (e.g. ``model.layers``).
        batches: dicts of model inputs (``labels`` are not passed on).
        device: where to compute.
        host: brings blocks to ``device`` and home (None: :class:`InMemoryBlocks`).

    Yields:
        One model output per batch, in order (logits on ``device``).
    """
    host = host if host is not None else InMemoryBlocks()
    blocks = model.get_submodule(prefix)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"{prefix} is a {type(blocks).__name__}, not a list of blocks")
    with torch.no_grad(), no_cache(model):
        # the modules outside the blocks sit on the device for the passes that run them only
        with host.outside(model, prefix, device):
            inputs = block_inputs(model, blocks[0], batches, device)
        outputs: list[Any] = []
        for index, block in enumerate(blocks):
            host.enter(index, block, device)
            outputs = [block(*args, **kwargs) for args, kwargs in inputs]
            inputs = [
                replace_hidden(args, kwargs, hidden_of(output))
                for (args, kwargs), output in zip(inputs, outputs, strict=True)
            ]
            host.leave(index, block, False)
        del inputs
        with host.outside(model, prefix, device), replaying(blocks, outputs) as current:
            for index, batch in enumerate(batches):
                current[0] = index
                yield model(**model_inputs(model, batch, device))
