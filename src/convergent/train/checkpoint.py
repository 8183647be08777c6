"""Atomic checkpoints: weights in safetensors, everything else loadable with ``weights_only``.

Layout of a run's checkpoint folder::

    checkpoints/
      step-00000100/model.safetensors   # the model's weights
      step-00000100/state.pt            # optimizer, scheduler, training step, RNG, progress
      latest                            # one line: the name of the newest complete checkpoint

A checkpoint is written into a temporary folder and renamed into place, and only then does
``latest`` move (itself through a temporary file and ``os.replace``). A write interrupted at
any point therefore leaves the previous checkpoint whole and ``latest`` pointing at it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors.torch import load_model, save_model
from torch import nn

WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "state.pt"
LATEST_FILE = "latest"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or not one of ours."""


def _fsync_directory(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # some file systems do not allow opening folders
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _replace_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half."""

    def write(handle: BinaryIO) -> None:
        handle.write(text.encode())

    _replace_atomically(path, write)


def save_torch_atomically(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)`` through a temporary file and ``os.replace``: never half written.

    Save only tensors, numbers, strings and containers, so that ``torch.load(path,
    weights_only=True)`` reads it back.
    """
    _replace_atomically(Path(path), lambda handle: torch.save(obj, handle))


def save_checkpoint(
    directory: str | Path,
    step: int,
    model: nn.Module,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write a checkpoint atomically and point ``latest`` at it.

    Args:
        directory: the checkpoints folder of a run.
        step: the global step; names the checkpoint ``step-XXXXXXXX``.
        model: its weights go to ``model.safetensors`` (shared tensors such as tied
            embeddings are handled by ``safetensors.torch.save_model``).
        state: everything else (optimizer and scheduler state dicts, RNG, counters); must
            hold only tensors, numbers, strings and containers so that it loads with
            ``torch.load(weights_only=True)``.
        keep: how many of the newest checkpoints to keep; older ones are deleted.

    Returns:
        The folder of the new checkpoint.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    final = root / name
    temporary = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
    try:
        save_model(model, str(temporary / WEIGHTS_FILE))
        torch.save(state, temporary / STATE_FILE)
        for file in temporary.iterdir():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
        if final.exists():  # a rerun of the same step: move the old one aside first
            shutil.rmtree(final)
        os.rename(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _fsync_directory(root)
    write_text_atomically(root / LATEST_FILE, name + "\n")
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """Find a checkpoint folder from a run folder, a checkpoints folder or a checkpoint.

    Raises:
        CheckpointError: when nothing under ``path`` looks like one of our checkpoints.
    """
    candidate = Path(path)
    if not candidate.exists():
        raise CheckpointError(f"no checkpoint at {candidate}: the path does not exist")
    for root in (candidate, candidate / "checkpoints"):
        if (root / WEIGHTS_FILE).is_file() and (root / STATE_FILE).is_file():
            return root
        latest = root / LATEST_FILE
        if latest.is_file():
            chosen = root / latest.read_text().strip()
            if (chosen / WEIGHTS_FILE).is_file():
                return chosen
    raise CheckpointError(
        f"{candidate} is not a convergent checkpoint: expected {WEIGHTS_FILE} and {STATE_FILE},"
        f" or a '{LATEST_FILE}' file naming one"
    )


def load_checkpoint(
    path: str | Path, model: nn.Module | None = None, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` (if given) and return its state.

    The state is read with ``torch.load(weights_only=True)``: no pickled code runs.
    """
    folder = resolve_checkpoint(path)
    if model is not None:
        missing, unexpected = load_model(model, str(folder / WEIGHTS_FILE), strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"checkpoint {folder} does not fit the model: missing {sorted(missing)[:5]},"
                f" unexpected {sorted(unexpected)[:5]}"
            )
    state: dict[str, Any] = torch.load(
        folder / STATE_FILE, map_location=map_location, weights_only=True
    )
    return state
