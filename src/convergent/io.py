"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Each writer fills a temporary file beside the target, fsyncs it, moves it into place with
``os.replace`` and then fsyncs the folder, so the rename itself survives a crash.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

__all__ = [
    "fsync_directory",
    "make_readable",
    "save_torch_atomically",
    "write_bytes_atomically",
    "write_text_atomically",
]


def fsync_directory(path: Path) -> None:
    """fsync the folder ``path``, so that a rename into it is durable (where allowed)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # some file systems do not allow opening folders
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def make_readable(file: int | str | Path) -> None:
    """Give ``file`` (an open descriptor or a path) the mode a plain ``open`` would: 0666 less
    the umask (0644 under the usual umask 022). ``tempfile.mkstemp`` and safetensors'
    ``save_file`` create files 0600, which would leave a written model or report unreadable
    to the other users of a shared folder."""
    mask = os.umask(0o022)
    os.umask(mask)
    if isinstance(file, int):
        os.fchmod(file, 0o666 & ~mask)
    else:
        os.chmod(file, 0o666 & ~mask)


def _replace_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    make_readable(descriptor)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half."""

    def write(handle: BinaryIO) -> None:
        handle.write(data)

    _replace_atomically(path, write)


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
