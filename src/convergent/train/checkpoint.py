"""Atomic, verified checkpoints: weights in safetensors, the rest loadable with ``weights_only``.

Layout of a run's checkpoint folder::

    checkpoints/
      step-00000100/model.safetensors   # the model's weights (sparse_model.safetensors when
                                        # written compressed: convergent.sparse.storage)
      step-00000100/state.pt            # optimizer, scheduler, training step, RNG, progress
      step-00000100/manifest.json       # format, step, write order, sha256 and size per file
      latest                            # one line: the name of the newest complete checkpoint

A checkpoint is written into a temporary folder; its files are fsynced, then the manifest is
written last, and only then is the folder renamed into place and ``latest`` moved (itself
through a temporary file and ``os.replace``). A folder in place without a valid manifest is
therefore incomplete or damaged by construction, and a write interrupted at any point leaves
the previous checkpoint whole and ``latest`` pointing at it.

Loading verifies sizes and sha256 against the manifest. Given a run or checkpoints folder,
a checkpoint that fails is reported in one warning line and the newest one that verifies is
loaded instead (``latest`` first, then the others newest-written first); when none verifies,
:class:`CheckpointError`. A checkpoint folder named explicitly is loaded only if it
verifies: no fallback.

Checkpoints written before manifests existed (both files, no ``manifest.json``) are
accepted, with a one-line warning that they are unverified: explicitly named, or as the
last resort when no checkpoint in the folder verifies.

Retention (``keep``) goes by write order, recorded in each manifest, not by folder name, so
a second run written into the same folder keeps its own newest checkpoints; the checkpoint
``latest`` names is never deleted.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from convergent.io import fsync_directory, write_bytes_atomically, write_text_atomically
from convergent.sparse.storage import (
    COMPRESSED_WEIGHTS,
    CompressedFileError,
    group_dims,
    load_compressed_into,
    write_compressed_file,
)

WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
LATEST_FILE = "latest"
CHECKSUM_SUFFIX = ".sha256"
_PREFIX = "step-"

logger = logging.getLogger(__name__)


_warned: set[str] = set()


def _warn_once(message: str, *args: Any) -> None:
    """Log a warning about a checkpoint once per process: a run that looks at the same damaged
    checkpoint several times (resume checks, then the load) reports it in one line."""
    line = message % args
    if line not in _warned:
        _warned.add(line)
        logger.warning(line)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, damaged or not one of ours."""


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def load_state_file(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``, with damaged or foreign files as one sentence.

    Raises:
        CheckpointError: when the file is unreadable, truncated, or refers to Python objects
            other than tensors, numbers, strings and containers.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, EOFError) as error:
        # torch's own message recommends weights_only=False, i.e. running whatever the file
        # holds: never pass that advice on. Name the refused object when there is one.
        match = re.search(r"GLOBAL ([\w.]+)", str(error))
        detail = f"it refers to the Python object {match.group(1)}" if match else "unreadable"
        raise CheckpointError(
            f"{path} is corrupt or not a convergent checkpoint ({detail}; only tensors, "
            "numbers, strings and containers are loaded)"
        ) from None
    except RuntimeError as error:
        if "PytorchStreamReader" not in str(error) and "zip archive" not in str(error):
            raise  # not the file's fault (a device that is missing, for instance)
        raise CheckpointError(
            f"{path} is corrupt or not a convergent checkpoint (not a readable torch archive)"
        ) from None


def save_torch_with_checksum(obj: Any, path: str | Path) -> None:
    """:func:`~convergent.io.save_torch_atomically`, plus ``<path>.sha256`` (``sha256sum``
    format) after it.

    The old checksum goes first, so an interruption leaves a file without a checksum (loaded
    with a warning), never a checksum that disagrees with a whole file.
    """
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    checksum = path.with_name(path.name + CHECKSUM_SUFFIX)
    checksum.unlink(missing_ok=True)

    write_bytes_atomically(path, data)
    write_text_atomically(checksum, f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")


def load_torch_with_checksum(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """Verify ``path`` against ``<path>.sha256`` and load it with ``weights_only=True``.

    A file without a checksum (written by an earlier version) loads with a warning.

    Raises:
        CheckpointError: when the file disagrees with its checksum or is not loadable.
    """
    path = Path(path)
    checksum = path.with_name(path.name + CHECKSUM_SUFFIX)
    if not checksum.is_file():
        _warn_once("%s has no %s checksum file; loading it unverified", path, CHECKSUM_SUFFIX)
    else:
        expected = checksum.read_text().split(maxsplit=1)[:1]
        if expected != [file_sha256(path)]:
            raise CheckpointError(
                f"{path} does not match the sha256 in {checksum.name}: the file is corrupt"
            )
    return load_state_file(path, map_location)


def _read_manifest(folder: Path) -> dict[str, Any]:
    """The parsed manifest; raises ``ValueError`` with the reason when it is not usable."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ValueError(f"{MANIFEST_FILE} is missing")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{MANIFEST_FILE} is unreadable ({type(error).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{MANIFEST_FILE} is not a format-{MANIFEST_FORMAT} manifest")
    files = manifest.get("files")
    if (
        not isinstance(files, dict)
        or STATE_FILE not in files
        or not {WEIGHTS_FILE, COMPRESSED_WEIGHTS} & set(files)
    ):
        raise ValueError(f"{MANIFEST_FILE} does not list {WEIGHTS_FILE} and {STATE_FILE}")
    return manifest


def verify_checkpoint(folder: str | Path) -> str | None:
    """Check a checkpoint folder against its manifest.

    Returns:
        None when every file the manifest lists is present with its recorded size and
        sha256; otherwise the reason, naming the file that failed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return "the folder does not exist"
    try:
        manifest = _read_manifest(folder)
    except ValueError as error:
        return str(error)
    for name, entry in manifest["files"].items():
        path = folder / name
        if Path(name).name != name or not isinstance(entry, dict):
            return f"{MANIFEST_FILE} has a malformed entry for {name!r}"
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry.get("bytes"):
            return f"{name} has {size} bytes, the manifest says {entry.get('bytes')}"
        if file_sha256(path) != entry.get("sha256"):
            return f"{name} does not match its sha256 in the manifest"
    return None


def _write_manifest(folder: Path, step: int, sequence: int) -> None:
    files = {
        file.name: {"sha256": file_sha256(file), "bytes": file.stat().st_size}
        for file in sorted(folder.iterdir())
    }
    manifest = {"format": MANIFEST_FORMAT, "step": step, "sequence": sequence, "files": files}
    with open(folder / MANIFEST_FILE, "w") as handle:
        handle.write(json.dumps(manifest, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _write_order(folder: Path) -> tuple[int, int]:
    """(sequence, step) from the manifest; (0, step in the name) for unreadable or old ones."""
    try:
        manifest = _read_manifest(folder)
        return int(manifest.get("sequence", 0)), int(manifest.get("step", 0))
    except (ValueError, TypeError):
        digits = folder.name.removeprefix(_PREFIX)
        return 0, int(digits) if digits.isdigit() else -1


def _checkpoint_folders(root: Path) -> list[Path]:
    """The ``step-*`` folders of ``root``, newest-written first."""
    folders = [path for path in root.glob(f"{_PREFIX}*") if path.is_dir()]
    return sorted(folders, key=_write_order, reverse=True)


def _latest_name(root: Path) -> str | None:
    try:
        return (root / LATEST_FILE).read_text().strip() or None
    except OSError:
        return None


def save_checkpoint(
    directory: str | Path,
    step: int,
    model: nn.Module,
    state: dict[str, Any],
    keep: int = 2,
    *,
    compressed: bool = False,
) -> Path:
    """Write a checkpoint atomically, with its manifest, and point ``latest`` at it.

    Args:
        directory: the checkpoints folder of a run.
        step: the global step; names the checkpoint ``step-XXXXXXXX``.
        model: its weights go to ``model.safetensors`` (shared tensors such as tied
            embeddings are handled by ``safetensors.torch.save_model``).
        state: everything else (optimizer and scheduler state dicts, RNG, counters); must
            hold only tensors, numbers, strings and containers so that it loads with
            ``torch.load(weights_only=True)``.
        keep: how many of the most recently written checkpoints to keep; older writes are
            deleted (never the one ``latest`` names).
        compressed: write the weights compressed (pruned matrices as their kept values and
            positions) to ``sparse_model.safetensors`` instead of ``model.safetensors``.

    Returns:
        The folder of the new checkpoint.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{_PREFIX}{step:08d}"
    final = root / name
    sequence = 1 + max((_write_order(folder)[0] for folder in _checkpoint_folders(root)), default=0)
    temporary = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
    try:
        if compressed:
            write_compressed_file(
                temporary / COMPRESSED_WEIGHTS, model.state_dict(), group_dims(model)
            )
        else:
            save_model(model, str(temporary / WEIGHTS_FILE))
        torch.save(state, temporary / STATE_FILE)
        for file in temporary.iterdir():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
        _write_manifest(temporary, step, sequence)
        fsync_directory(temporary)
        if final.exists():  # a rerun of the same step: move the old one aside, then drop it
            aside = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}.old."))
            os.replace(final, aside / name)
            os.rename(temporary, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    fsync_directory(root)
    write_text_atomically(root / LATEST_FILE, name + "\n")
    protected = {name, _latest_name(root)}
    for old in _checkpoint_folders(root)[keep:]:
        if old.name not in protected:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _is_unverified_old_checkpoint(folder: Path) -> bool:
    """Written before manifests: both files, no manifest."""
    return (
        not (folder / MANIFEST_FILE).exists()
        and (folder / WEIGHTS_FILE).is_file()
        and (folder / STATE_FILE).is_file()
    )


def _check_named(folder: Path) -> Path:
    reason = verify_checkpoint(folder)
    if reason is None:
        return folder
    if _is_unverified_old_checkpoint(folder):
        _warn_once(
            "checkpoint %s has no %s (written by an earlier version); loading it unverified",
            folder,
            MANIFEST_FILE,
        )
        return folder
    raise CheckpointError(f"checkpoint {folder} failed verification: {reason}")


def _newest_verified(root: Path) -> Path:
    named = _latest_name(root)
    candidates = [root / named] if named is not None else []
    candidates += [folder for folder in _checkpoint_folders(root) if folder.name != named]
    unverified: list[Path] = []
    first_failure = ""
    for folder in candidates:
        reason = verify_checkpoint(folder)
        if reason is None:
            for skipped in unverified:
                _warn_once(
                    "checkpoint %s failed verification (%s); loading the older %s instead",
                    skipped,
                    f"{MANIFEST_FILE} is missing",
                    folder.name,
                )
            return folder
        if folder.is_dir() and _is_unverified_old_checkpoint(folder):
            unverified.append(folder)
            continue
        first_failure = first_failure or f"{folder.name}: {reason}"
        _warn_once("checkpoint %s failed verification (%s); trying an older one", folder, reason)
    if unverified:
        _warn_once(
            "checkpoint %s has no %s (written by an earlier version); loading it unverified",
            unverified[0],
            MANIFEST_FILE,
        )
        return unverified[0]
    raise CheckpointError(
        f"no checkpoint in {root} passes verification (newest failure {first_failure})"
    )


def resolve_checkpoint(path: str | Path) -> Path:
    """Find a verified checkpoint folder from a run folder, a checkpoints folder or a checkpoint.

    A run or checkpoints folder falls back from a damaged newest checkpoint to the newest
    one that verifies (one warning line per checkpoint skipped); a checkpoint folder named
    explicitly must verify itself.

    Raises:
        CheckpointError: when nothing under ``path`` looks like one of our checkpoints, or
            nothing there passes verification.
    """
    candidate = Path(path)
    if not candidate.exists():
        raise CheckpointError(f"no checkpoint at {candidate}: the path does not exist")
    markers = (MANIFEST_FILE, WEIGHTS_FILE, COMPRESSED_WEIGHTS, STATE_FILE)
    if any((candidate / name).exists() for name in markers):
        return _check_named(candidate)
    for root in (candidate, candidate / "checkpoints"):
        if (root / LATEST_FILE).is_file() or _checkpoint_folders(root):
            return _newest_verified(root)
    raise CheckpointError(
        f"{candidate} is not a convergent checkpoint: expected {WEIGHTS_FILE} and {STATE_FILE},"
        f" or a '{LATEST_FILE}' file naming one"
    )


def load_checkpoint(
    path: str | Path, model: nn.Module | None = None, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Load a verified checkpoint's weights into ``model`` (if given) and return its state.

    ``path`` is resolved by :func:`resolve_checkpoint` (verification and fallback). The
    state is read with ``torch.load(weights_only=True)``: no pickled code runs.

    Raises:
        CheckpointError: no verified checkpoint, a damaged or foreign file, or weights that
            do not fit ``model``.
    """
    folder = resolve_checkpoint(path)
    if model is not None and (folder / COMPRESSED_WEIGHTS).is_file():
        try:
            load_compressed_into(model, folder / COMPRESSED_WEIGHTS)
        except CompressedFileError as error:
            raise CheckpointError(f"checkpoint {folder}: {error}") from None
    elif model is not None:
        weights = folder / WEIGHTS_FILE
        try:
            missing, unexpected = load_model(model, str(weights), strict=False)
        except SafetensorError as error:
            raise CheckpointError(
                f"{weights} is corrupt or not a convergent checkpoint"
                f" ({str(error).splitlines()[0] if str(error) else 'unreadable'})"
            ) from None
        if missing or unexpected:
            raise CheckpointError(
                f"checkpoint {folder} does not fit the model: missing {sorted(missing)[:5]},"
                f" unexpected {sorted(unexpected)[:5]}"
            )
    state: dict[str, Any] = load_state_file(folder / STATE_FILE, map_location)
    return state
