"""Compressed weights files: a state dict encoded tensor by tensor into safetensors, with a
JSON header and checksums, and read back bit for bit.

    write_compressed_file("sparse_model.safetensors", model.state_dict(), group_dims(model))
    load_compressed_into(model, folder)          # every checksum first, then tensor by tensor

Each tensor is stored in the smallest layout of :mod:`convergent.sparse.encoding` (a bitmask
and the kept values, N:M values and positions, or dense). A tensor that shares its storage
with an earlier one (tied embeddings) is stored once and named as an ``alias`` of it.

The parts go into one safetensors file; its metadata entry ``convergent.sparse`` is a JSON
header (format, version, per tensor: kind, shape, dtype, parts, sizes and the sha256 of every
part's bytes), documented in ``docs/sparse-format.md``. :func:`encode_state_dict` is pure, so a
writer that streams a model block by block can call it once per shard and then write an
index (:func:`write_compressed_index`). Reading verifies every checksum before it decodes
anything, so a damaged file is one error sentence and nothing is loaded half-way.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from convergent.io import make_readable
from convergent.sparse.encoding import N_M, EncodingError, decode_tensor, encode_tensor
from convergent.sparse.selection import is_conv1d

FORMAT = "convergent-sparse"
FORMAT_VERSION = 1
HEADER_KEY = "convergent.sparse"
COMPRESSED_WEIGHTS = "sparse_model.safetensors"
COMPRESSED_INDEX = "sparse_model.safetensors.index.json"
ALIAS = "alias"
PART_SEPARATOR = "#"
# config.json's quantization_config names the format by this quant_method, so that transformers
# finds the reader convergent registers (convergent/sparse/transformers_quantizer.py).
QUANT_METHOD = FORMAT


class CompressedFileError(ValueError):
    """A compressed weights file that is missing, damaged or not ours."""


def quantization_entry(weights: str = COMPRESSED_WEIGHTS) -> dict[str, Any]:
    """The ``quantization_config`` a compressed folder's ``config.json`` carries: the
    ``quant_method`` that transformers looks its reader up by, and the weights file
    (``COMPRESSED_WEIGHTS`` or ``COMPRESSED_INDEX``)."""
    return {"quant_method": QUANT_METHOD, "weights": weights, "version": FORMAT_VERSION}


# --- a state dict ---------------------------------------------------------------------------


def group_dims(model: nn.Module) -> dict[str, int]:
    """The input dimension of each weight whose layer stores it ``[in, out]`` (GPT-2's
    ``Conv1D``: 0); every other tensor groups along dimension 1."""
    return {
        f"{name}.weight" if name else "weight": 0
        for name, module in model.named_modules()
        if is_conv1d(module)
    }


def _sha256(tensor: Tensor) -> str:
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    # The buffer itself, not a bytes copy (numpy's stubs do not declare its buffer protocol).
    return hashlib.sha256(data.numpy()).hexdigest()  # type: ignore[arg-type]


def _storage_key(tensor: Tensor) -> tuple[Any, ...]:
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def encode_state_dict(
    state: Mapping[str, Tensor], dims: Mapping[str, int] | None = None
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Encode every tensor of ``state``: the safetensors tensors and the JSON header.

    Args:
        state: name -> tensor (a ``state_dict``, or one shard of it).
        dims: name -> the dimension N:M groups run along (default 1; see
            :func:`group_dims`).

    Returns:
        (stored name -> tensor, ready for ``safetensors.torch.save_file``; the header, whose
        ``tensors`` maps each name of ``state`` to its entry with the sha256 of every part).
    """
    dims = dims or {}
    stored: dict[str, Tensor] = {}
    entries: dict[str, dict[str, Any]] = {}
    seen: dict[tuple[Any, ...], str] = {}
    storages: set[int] = set()
    for name, tensor in state.items():
        if PART_SEPARATOR in name:
            raise ValueError(f"tensor name {name!r} contains {PART_SEPARATOR!r}, which we reserve")
        key = _storage_key(tensor)
        if key in seen:  # tied weights: one copy, and a name that points at it
            entries[name] = {"kind": ALIAS, "of": seen[key]}
            continue
        seen[key] = name
        encoded = encode_tensor(tensor, dims.get(name, 1))
        names = {part: name if part == "dense" else f"{name}{PART_SEPARATOR}{part}"
                 for part in encoded.parts}  # fmt: skip
        for part, value in encoded.parts.items():
            # safetensors refuses tensors that share memory (views of one buffer): copy those.
            pointer = value.untyped_storage().data_ptr()
            stored[names[part]] = value.clone() if pointer in storages else value
            storages.add(pointer)
        entries[name] = {
            **encoded.entry,
            "parts": names,
            "sha256": {part: _sha256(value) for part, value in encoded.parts.items()},
        }
    return stored, {"format": FORMAT, "version": FORMAT_VERSION, "tensors": entries}


def write_compressed_file(
    path: str | Path, state: Mapping[str, Tensor], dims: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Encode ``state`` and write it to ``path`` atomically (a temporary file beside it,
    fsynced, then renamed).

    Returns:
        The header written.
    """
    stored, header = encode_state_dict(state, dims)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(descriptor)
    try:
        save_file(stored, temporary, metadata={HEADER_KEY: json.dumps(header)})
        make_readable(temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return header


def write_compressed_index(folder: str | Path, shards: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write ``COMPRESSED_INDEX`` for shards already written into ``folder``.

    Args:
        folder: the folder that holds the shard files.
        shards: shard file name -> the header :func:`write_compressed_file` returned for it.

    Returns:
        The index path.
    """
    weight_map = {
        name: file for file, header in shards.items() for name in header.get("tensors", {})
    }
    # "metadata": transformers' index reader requires the key (from_pretrained reads shards too)
    index = {"format": FORMAT, "version": FORMAT_VERSION, "metadata": {}, "weight_map": weight_map}
    path = Path(folder) / COMPRESSED_INDEX
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    make_readable(descriptor)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(json.dumps(index, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path


# --- reading --------------------------------------------------------------------------------


def compressed_files(location: str | Path) -> list[Path]:
    """The compressed weights files of a folder (one file, or the shards its index names), or
    ``[location]`` for a file. Empty when the folder holds none."""
    path = Path(location)
    if path.is_file():
        return [path]
    if (path / COMPRESSED_INDEX).is_file():
        try:
            index = json.loads((path / COMPRESSED_INDEX).read_text())
            files = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise CompressedFileError(
                f"{path / COMPRESSED_INDEX} is damaged: it is not a readable index of shards"
            ) from None
        return [path / file for file in files]
    if (path / COMPRESSED_WEIGHTS).is_file():
        return [path / COMPRESSED_WEIGHTS]
    return []


def has_compressed_weights(folder: str | Path) -> bool:
    """Whether ``folder`` holds ``COMPRESSED_WEIGHTS`` or ``COMPRESSED_INDEX``."""
    path = Path(folder)
    return (path / COMPRESSED_WEIGHTS).is_file() or (path / COMPRESSED_INDEX).is_file()


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of one compressed file.

    Raises:
        CompressedFileError: a missing file, a damaged one, or a safetensors file of others.
    """
    path = Path(path)
    if not path.is_file():
        raise CompressedFileError(f"{path} does not exist")
    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CompressedFileError(
            f"{path} is damaged: not a readable safetensors file ({detail})"
        ) from None
    if HEADER_KEY not in metadata:
        raise CompressedFileError(
            f"{path} is not a compressed convergent file: its metadata has no {HEADER_KEY!r} header"
        )
    try:
        header = json.loads(metadata[HEADER_KEY])
    except json.JSONDecodeError:
        raise CompressedFileError(
            f"{path} is damaged: its {HEADER_KEY!r} header is not JSON"
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CompressedFileError(f"{path} is damaged: its header names no {FORMAT!r} format")
    if header.get("version") != FORMAT_VERSION:
        raise CompressedFileError(
            f"{path} is format version {header.get('version')}; this convergent reads version "
            f"{FORMAT_VERSION}"
        )
    if not isinstance(header.get("tensors"), dict):
        raise CompressedFileError(f"{path} is damaged: its header lists no tensors")
    return header


def _read_parts(handle: Any, entry: Mapping[str, Any], name: str, path: Path) -> dict[str, Tensor]:
    try:
        parts = {part: handle.get_tensor(stored) for part, stored in entry["parts"].items()}
    except (SafetensorError, KeyError, TypeError, AttributeError) as error:
        raise CompressedFileError(
            f"{path} is damaged: {name}'s parts cannot be read ({type(error).__name__})"
        ) from None
    return parts


def verify_compressed_file(path: str | Path) -> dict[str, Any]:
    """Check every part of ``path`` against the sha256 in its header.

    Returns:
        The header.

    Raises:
        CompressedFileError: naming the first tensor whose bytes differ (nothing is decoded).
    """
    path = Path(path)
    header = read_header(path)
    with safe_open(path, framework="pt") as handle:
        for name, entry in header["tensors"].items():
            if entry.get("kind") == ALIAS:
                continue
            sums = entry.get("sha256") or {}
            for part, value in _read_parts(handle, entry, name, path).items():
                if _sha256(value) != sums.get(part):
                    raise CompressedFileError(
                        f"{path} is damaged: the {part} of {name} does not match its sha256 "
                        "(nothing was loaded)"
                    )
    return header


def iter_decoded(path: str | Path, header: Mapping[str, Any]) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) for each stored (non-alias) tensor of one verified file, one at a time."""
    path = Path(path)
    with safe_open(path, framework="pt") as handle:
        for name, entry in header["tensors"].items():
            if entry.get("kind") != ALIAS:
                parts = _read_parts(handle, entry, name, path)
                try:
                    tensor = decode_tensor(entry, parts, name)
                except (EncodingError, KeyError, TypeError, ValueError) as error:
                    raise CompressedFileError(f"{path} is damaged: {error}") from None
                yield name, tensor


def _verified_headers(location: str | Path) -> dict[Path, dict[str, Any]]:
    files = compressed_files(location)
    if not files:
        raise CompressedFileError(
            f"{location} holds no compressed weights ({COMPRESSED_WEIGHTS} or {COMPRESSED_INDEX})"
        )
    return {file: verify_compressed_file(file) for file in files}


def _aliases(headers: Mapping[Path, Mapping[str, Any]]) -> dict[str, str]:
    entries = {
        name: entry for header in headers.values() for name, entry in header["tensors"].items()
    }
    aliases = {name: entry["of"] for name, entry in entries.items() if entry.get("kind") == ALIAS}
    for name, target in aliases.items():
        if entries.get(target, {}).get("kind") in (None, ALIAS):
            raise CompressedFileError(f"{name} is an alias of {target!r}, which is not stored")
    return aliases


def read_compressed(location: str | Path) -> dict[str, Tensor]:
    """Every tensor of a compressed file or folder, decoded bit for bit (verified first).

    Raises:
        CompressedFileError: no compressed weights there, or a damaged file.
    """
    headers = _verified_headers(location)
    state = {
        name: tensor
        for path, header in headers.items()
        for name, tensor in iter_decoded(path, header)
    }
    for name, target in _aliases(headers).items():
        state[name] = state[target]
    return state


def _entry_layout(header_entry: Mapping[str, Any]) -> tuple[list[int], str]:
    return [int(size) for size in header_entry["shape"]], str(header_entry["dtype"])


@torch.no_grad()
def load_compressed_into(model: nn.Module, location: str | Path) -> dict[str, Any]:
    """Load a compressed file or folder into ``model``, bit for bit, one tensor at a time.

    Every checksum is verified and every name and shape checked against the model before
    the first tensor is copied; each parameter or buffer takes the stored dtype.

    Returns:
        The merged header (``tensors`` of every shard).

    Raises:
        CompressedFileError: no compressed weights, a damaged file, or weights that do not fit
            the model (missing, unexpected or differently shaped tensors).
    """
    headers = _verified_headers(location)
    aliases = _aliases(headers)
    entries = {
        name: entry for header in headers.values() for name, entry in header["tensors"].items()
    }
    targets = dict(model.state_dict(keep_vars=True))
    missing = sorted(set(targets) - set(entries))
    unexpected = sorted(set(entries) - set(targets))
    if missing or unexpected:
        raise CompressedFileError(
            f"the weights in {location} do not fit the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for name in entries:
        shape = _entry_layout(entries[aliases.get(name, name)])[0]
        if list(targets[name].shape) != shape:
            raise CompressedFileError(
                f"the weights in {location} do not fit the model: {name} is stored "
                f"{shape}, the model's is {list(targets[name].shape)}"
            )
    for path, header in headers.items():
        for name, tensor in iter_decoded(path, header):
            for target_name in (name, *(alias for alias, of in aliases.items() if of == name)):
                target = targets[target_name]
                if target.dtype != tensor.dtype:
                    target.data = target.data.to(tensor.dtype)
                target.data.copy_(tensor)
    return {"format": FORMAT, "version": FORMAT_VERSION, "tensors": entries}


def size_rows(header: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per stored tensor of a header: name, kind, shape, dense and stored bytes."""
    return [
        {
            "name": name,
            "kind": entry["kind"] if entry["kind"] != N_M else f"{entry['n']}:{entry['m']}",
            "shape": entry["shape"],
            "dense_bytes": entry["dense_bytes"],
            "stored_bytes": entry["stored_bytes"],
        }
        for name, entry in header["tensors"].items()
        if entry.get("kind") != ALIAS
    ]


# --- shard by shard (a model streamed one block at a time) -----------------------------------


class CompressedShards:
    """Writes compressed shards, ``sparse_model-0000i-of-0000N.safetensors``, and their index
    (a :class:`convergent.models.streamed.ShardWriter`).

    Args:
        folder: where to write.
        dims: name -> the dimension N:M groups run along (see :func:`group_dims`).
    """

    def __init__(self, folder: str | Path, dims: Mapping[str, int] | None = None) -> None:
        self.folder = Path(folder)
        self.dims = dict(dims or {})
        self.headers: dict[str, dict[str, Any]] = {}

    def write(self, shard: int, shards: int, state: dict[str, Tensor]) -> None:
        file = f"sparse_model-{shard:05d}-of-{shards:05d}.safetensors"
        self.headers[file] = write_compressed_file(self.folder / file, state, self.dims)

    def close(self) -> None:
        write_compressed_index(self.folder, self.headers)


class CompressedReader:
    """A compressed folder's tensors, decoded file by file as they are asked for (a
    :class:`convergent.models.streamed.TensorReader`); every checksum is verified first."""

    def __init__(self, folder: str | Path) -> None:
        self.headers = _verified_headers(folder)
        self.aliases = _aliases(self.headers)
        self.files = {
            name: path for path, header in self.headers.items() for name in header["tensors"]
        }

    def names(self) -> set[str]:
        return set(self.files)

    def read(self, names: list[str]) -> dict[str, Tensor]:
        wanted = {name: self.aliases.get(name, name) for name in names}
        by_file: dict[Path, dict[str, Any]] = {}
        for stored in set(wanted.values()):
            path = self.files[stored]
            by_file.setdefault(path, {})[stored] = self.headers[path]["tensors"][stored]
        decoded: dict[str, Tensor] = {}
        for path, entries in by_file.items():
            decoded.update(iter_decoded(path, {"tensors": entries}))
        return {name: decoded[stored] for name, stored in wanted.items()}
