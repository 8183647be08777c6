"""One tensor, compressed: the layouts a pruned matrix is stored in, and back, bit for bit.

    encoded = encode_tensor(weight, group_dim=1)     # the smallest layout, and its parts
    assert decode_tensor(encoded.entry, encoded.parts).equal(weight)

A floating-point tensor of two or more dimensions is stored in the smallest of:

- ``dense``: the tensor as it is;
- ``bitmask``: one bit per entry (1 = nonzero, packed eight to a byte, entry ``8j + i`` in
  bit ``i`` of byte ``j``, row-major order) and the nonzero values in that order;
- ``n:m``: along ``group_dim``, every group of M consecutive entries holds at most N
  nonzeros; stored are N values per group (its nonzeros, padded with its first zeros, in
  position order) and which N positions they are: the rank of that subset among the
  C(M, N) subsets of the group in lexicographic order, in ceil(log2 C(M, N)) bits per group.

A zero's sign is a bit like any other (pruning by ``w * mask`` leaves -0.0 where w < 0): when
any zero is -0.0, a ``zero_signs`` part holds one bit per zero (row-major order, 1 = -0.0),
so that decoding is bit for bit. Every other tensor is stored dense. The files that hold the
parts are :mod:`convergent.sparse.storage`'s; the format is ``docs/sparse-format.md``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

DENSE, BITMASK, N_M = "dense", "bitmask", "n:m"
# The group sizes M an N:M layout is looked for in (N is the most nonzeros of any group).
GROUP_SIZES = (4, 8, 16)
COMPRESSIBLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


class EncodingError(ValueError):
    """Stored parts that do not fit their header entry."""


# --- bits ---------------------------------------------------------------------------------


def pack_bits(bits: Tensor) -> Tensor:
    """bool ``[n]`` -> uint8 ``[ceil(n / 8)]``: entry ``8j + i`` is bit ``i`` of byte ``j``."""
    flat = bits.reshape(-1).to(torch.uint8)
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % 8))
    return (padded.view(-1, 8) * _BIT_WEIGHTS).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: Tensor, count: int) -> Tensor:
    """The inverse of :func:`pack_bits`: the first ``count`` bits, as bool ``[count]``."""
    return (packed.reshape(-1, 1) & _BIT_WEIGHTS).ne(0).reshape(-1)[:count]


def pack_integers(values: Tensor, width: int) -> Tensor:
    """Non-negative integers below ``2**width``, ``width`` bits each (low bit first), packed."""
    shifts = torch.arange(width, dtype=torch.int64)
    return pack_bits((values.reshape(-1, 1).to(torch.int64) >> shifts) & 1)


def unpack_integers(packed: Tensor, count: int, width: int) -> Tensor:
    """The inverse of :func:`pack_integers`: ``count`` int64 values."""
    bits = unpack_bits(packed, count * width).view(count, width).to(torch.int64)
    return (bits << torch.arange(width, dtype=torch.int64)).sum(dim=1)


@functools.lru_cache(maxsize=32)
def subsets(n: int, m: int) -> tuple[Tensor, Tensor]:
    """The C(m, n) subsets of n positions out of m, in lexicographic order, as
    (positions ``[C, n]``, rank of each m-bit membership pattern ``[2**m]``, -1 if not one)."""
    positions = torch.tensor(list(itertools.combinations(range(m), n)), dtype=torch.int64)
    patterns = (1 << positions).sum(dim=1)
    ranks = torch.full((1 << m,), -1, dtype=torch.int64)
    ranks[patterns] = torch.arange(len(positions))
    return positions, ranks


def rank_bits(n: int, m: int) -> int:
    """Bits per group for an n:m subset rank: ceil(log2 C(m, n))."""
    return math.ceil(math.log2(math.comb(m, n)))


# --- one tensor -----------------------------------------------------------------------------


@dataclass
class Encoded:
    """One tensor, encoded: its header entry (without checksums) and its stored parts."""

    entry: dict[str, Any]
    parts: dict[str, Tensor]

    @property
    def stored_bytes(self) -> int:
        """Bytes of the parts."""
        return sum(part.numel() * part.element_size() for part in self.parts.values())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# Entries per slice when selecting a tensor's nonzeros (each slice's int64 positions are
# built, not the whole tensor's).
SLICE = 1 << 20


def _zero_signs(flat: Tensor) -> dict[str, Tensor]:
    """``{"zero_signs": packed}`` when some zero of ``flat`` is -0.0, else ``{}``."""
    zeros = flat == 0
    negative = torch.signbit(flat) & zeros  # bools only: selecting the zeros builds positions
    if not bool(negative.any()):
        return {}
    return {"zero_signs": pack_bits(negative[zeros])}


def _nonzero_values(flat: Tensor, nonzero: Tensor, count: int) -> Tensor:
    """``flat[nonzero]`` (``count`` entries), selected a slice at a time."""
    values = flat.new_empty(count)
    start = 0
    for part, keep in zip(flat.split(SLICE), nonzero.split(SLICE), strict=True):
        kept = part[keep]
        values[start : start + kept.numel()] = kept
        start += kept.numel()
    return values


def _bitmask(flat: Tensor, count: int, signs: dict[str, Tensor]) -> dict[str, Tensor]:
    nonzero = flat != 0
    values = _nonzero_values(flat, nonzero, count)
    return {"mask": pack_bits(nonzero), "values": values, **signs}


def _grouped(tensor: Tensor, group_dim: int, m: int) -> Tensor:
    """``[groups, m]``: the tensor with ``group_dim`` moved last, cut into groups of m."""
    return tensor.movedim(group_dim, -1).reshape(-1, m)


def _n_m_parts(groups: Tensor, n: int, m: int, signs: dict[str, Tensor]) -> dict[str, Tensor]:
    nonzero = groups != 0
    # Each group's nonzeros first, then its zeros, each in position order; keep the first n.
    order = nonzero.to(torch.int64) * m + (m - 1 - torch.arange(m))
    chosen = order.topk(n, dim=1).indices.sort(dim=1).values
    patterns = (1 << chosen).sum(dim=1)
    ranks = subsets(n, m)[1][patterns]
    width = rank_bits(n, m)
    return {
        "values": groups.gather(1, chosen).reshape(-1),  # a new tensor already
        "ranks": pack_integers(ranks, width),
        **signs,
    }


def _n_m_candidates(
    tensor: Tensor, group_dim: int, zeros: int
) -> Iterator[tuple[int, int, Tensor]]:
    """(n, m, groups) for each M of ``GROUP_SIZES`` that divides the group dimension and whose
    fullest group leaves at least one zero (so that needs ``zeros`` >= one per group)."""
    length = tensor.shape[group_dim]
    for m in GROUP_SIZES:
        if length % m or zeros * m < tensor.numel():
            continue
        groups = _grouped(tensor, group_dim, m)
        # uint8 counts (m <= 16): an int64 count per group, or count_nonzero, allocate more
        # than the tensor itself
        n = int((groups != 0).sum(dim=1, dtype=torch.uint8).max()) if groups.numel() else 0
        if 1 <= n < m:
            yield n, m, groups


def encode_tensor(tensor: Tensor, group_dim: int = 1) -> Encoded:
    """Encode one tensor in the smallest layout (module docstring); dense when none is smaller.

    Args:
        tensor: any tensor (moved to the CPU).
        group_dim: the dimension N:M groups run along (a layer's inputs: 1 for ``nn.Linear``
            and convolutions, 0 for GPT-2's ``Conv1D``).

    Returns:
        An :class:`Encoded` whose entry holds ``kind``, ``shape``, ``dtype``, ``dense_bytes``,
        ``stored_bytes``, ``nonzero`` and, for N:M, ``n``, ``m``, ``group_dim``.
    """
    tensor = tensor.detach().cpu().contiguous()
    entry: dict[str, Any] = {
        "shape": list(tensor.shape),
        "dtype": _dtype_name(tensor.dtype),
        "dense_bytes": tensor.numel() * tensor.element_size(),
    }
    best = Encoded({**entry, "kind": DENSE}, {"dense": tensor})
    if tensor.dtype in COMPRESSIBLE_DTYPES and tensor.ndim >= 2 and tensor.numel():
        entry["nonzero"] = int(torch.count_nonzero(tensor))
        best.entry["nonzero"] = entry["nonzero"]
        zeros = tensor.numel() - entry["nonzero"]
        values_and_mask = entry["nonzero"] * tensor.element_size() + (tensor.numel() + 7) // 8
        if values_and_mask >= best.stored_bytes and zeros * max(GROUP_SIZES) < tensor.numel():
            # No layout can be smaller (a bitmask's values alone, or N:M without a zero in
            # every group): do not build them (a dense embedding table, written last by a
            # streamed prune, would be copied several times over).
            best.entry["stored_bytes"] = best.stored_bytes
            return best
        flat = tensor.reshape(-1)
        signs = _zero_signs(flat)
        # The bitmask layout copies every nonzero: build it only when it can be the smaller.
        bitmask_bytes = (
            entry["nonzero"] * tensor.element_size()
            + (flat.numel() + 7) // 8
            + sum(part.numel() * part.element_size() for part in signs.values())
        )
        candidates = []
        if bitmask_bytes < best.stored_bytes:
            bitmask = _bitmask(flat, entry["nonzero"], signs)
            candidates.append(Encoded({**entry, "kind": BITMASK}, bitmask))
        dim = group_dim % tensor.ndim
        for n, m, groups in _n_m_candidates(tensor, dim, zeros):
            layout = {"kind": N_M, "n": n, "m": m, "group_dim": dim}
            candidates.append(Encoded({**entry, **layout}, _n_m_parts(groups, n, m, signs)))
        for candidate in candidates:  # ties keep the simpler layout, listed first
            if candidate.stored_bytes < best.stored_bytes:
                best = candidate
    best.entry["stored_bytes"] = best.stored_bytes
    return best


def _apply_zero_signs(flat: Tensor, parts: Mapping[str, Tensor], name: str) -> None:
    if "zero_signs" not in parts:
        return
    zeros = flat == 0
    count = int(zeros.sum())
    _check_part_size(parts["zero_signs"], math.ceil(count / 8), name, "zero_signs")
    negative = unpack_bits(parts["zero_signs"], count)
    flat[zeros] = torch.where(negative, -0.0, 0.0).to(flat.dtype)


def _check_part_size(part: Tensor, expected: int, name: str, what: str) -> None:
    if part.numel() != expected:
        raise EncodingError(
            f"{name}'s {what} holds {part.numel()} entries where its header implies {expected}"
        )


def decode_tensor(entry: Mapping[str, Any], parts: Mapping[str, Tensor], name: str = "") -> Tensor:
    """The tensor that :func:`encode_tensor` encoded, bit for bit.

    Raises:
        EncodingError: parts that do not fit the entry (a header that was edited).
    """
    shape = [int(size) for size in entry["shape"]]
    dtype = getattr(torch, str(entry["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise EncodingError(f"{name} has an unknown dtype {entry['dtype']!r}")
    numel = math.prod(shape)
    kind = entry["kind"]
    if kind == DENSE:
        dense = parts["dense"]
        if list(dense.shape) != shape or dense.dtype != dtype:
            raise EncodingError(f"{name}'s stored tensor does not match its header")
        return dense
    values = parts["values"]
    if values.dtype != dtype:
        raise EncodingError(f"{name}'s values are {values.dtype}, its header says {dtype}")
    if kind == BITMASK:
        _check_part_size(parts["mask"], math.ceil(numel / 8), name, "mask")
        nonzero = unpack_bits(parts["mask"], numel)
        _check_part_size(values, int(nonzero.sum()), name, "values")
        flat = torch.zeros(numel, dtype=dtype)
        flat[nonzero] = values
    elif kind == N_M:
        n, m, dim = int(entry["n"]), int(entry["m"]), int(entry["group_dim"])
        moved = [*shape[:dim], *shape[dim + 1 :], shape[dim]]
        count = numel // m
        _check_part_size(values, count * n, name, "values")
        _check_part_size(parts["ranks"], math.ceil(count * rank_bits(n, m) / 8), name, "ranks")
        positions, _ = subsets(n, m)
        ranks = unpack_integers(parts["ranks"], count, rank_bits(n, m))
        if bool((ranks >= len(positions)).any()):
            raise EncodingError(f"{name} has a group rank past C({m}, {n})")
        groups = torch.zeros(count, m, dtype=dtype)
        groups.scatter_(1, positions[ranks], values.view(count, n))
        flat = groups.view(moved).movedim(-1, dim).contiguous().view(-1)
    else:
        raise EncodingError(f"{name} has an unknown kind {kind!r}")
    _apply_zero_signs(flat, parts, name)
    return flat.view(shape)
