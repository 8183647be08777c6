"""Exact magnitude top-k over many tensors at once, without concatenating them.

To keep the largest ``n - k`` magnitudes of a set of tensors we need the k-th smallest
magnitude. ``torch.nn.utils.prune`` finds it with ``topk`` on a concatenated copy of every
magnitude, which costs a copy of the model and a partial sort. Here the threshold comes from
a radix select on the bit patterns instead: for non-negative IEEE floats the order of the
values is the order of their bits read as integers, so two histograms (of the high and of
the low bits) over the tensors, read in place chunk by chunk, pin down the k-th magnitude
exactly. Ties at the threshold are then broken in the tensors' order so that exactly ``k``
entries are pruned.

Both routes are here: :func:`magnitude_threshold_reference` (concatenate, ``kthvalue``) and
:func:`magnitude_threshold` (radix select), tested equal. :func:`keep_largest` without a
given threshold goes faster still: a sample of the magnitudes brackets the k-th one, and a
single pass writes the masks of everything above the bracket and collects the few entries
inside it, which a small stable sort then settles exactly (falling back to the radix select
in the unlikely case that the sample missed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# Bits 31..15 of a float32 magnitude (the sign bit is zero) index the first histogram,
# bits 14..0 the second.
HIGH_BITS = 16
LOW_BITS = 15
CHUNK = 1 << 22  # elements per chunk: bounds the temporaries to a few MB


def count_to_prune(sparsity: float, total: int) -> int:
    """How many of ``total`` entries a ``sparsity`` in [0, 1] prunes: ``round(sparsity * total)``.

    The rounding is Python's, as in ``torch.nn.utils.prune``, so the counts agree with it.
    """
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    return round(sparsity * total)


class _Buffers:
    """Scratch tensors reused chunk after chunk: fresh temporaries would cost page faults.

    They hold the longest chunk of ``tensors`` (at most ``CHUNK``): a 4M-long buffer of ones
    for a layer of 100k weights was most of a small mask's time.
    """

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        size = min(CHUNK, max((tensor.numel() for tensor in tensors), default=0))
        device = tensors[0].device
        self.floats = torch.empty(size, dtype=torch.float32, device=device)
        self.bits = torch.empty(size, dtype=torch.int32, device=device)
        self.index = torch.empty(size, dtype=torch.int32, device=device)
        self.flag = torch.empty(size, dtype=torch.bool, device=device)
        self.ones = torch.ones(size, dtype=torch.long, device=device)

    def magnitude_bits(self, chunk: Tensor) -> Tensor:
        """The bits of ``|chunk|`` as float32, read as int32 (order-preserving)."""
        size = chunk.numel()
        if chunk.dtype != torch.float32:
            chunk = self.floats[:size].copy_(chunk)
        return torch.bitwise_and(chunk.view(torch.int32), 0x7FFFFFFF, out=self.bits[:size])

    def high_bits(self, bits: Tensor) -> Tensor:
        return torch.bitwise_right_shift(bits, LOW_BITS, out=self.index[: bits.numel()])


def _chunks(tensors: Sequence[Tensor]) -> list[Tensor]:
    flat = [tensor.detach().reshape(-1) for tensor in tensors]
    return [part for tensor in flat for part in tensor.split(CHUNK)]


def _supports_radix(tensors: Sequence[Tensor]) -> bool:
    # float64 magnitudes do not all survive the trip to float32; use the reference there.
    return all(t.dtype in (torch.float32, torch.float16, torch.bfloat16) for t in tensors)


@dataclass(frozen=True)
class Threshold:
    """The k-th smallest magnitude and how many magnitudes lie below and at it."""

    value: Tensor
    below: int
    equal: int


def _compare_dtype(tensors: Sequence[Tensor]) -> torch.dtype:
    """float64 when any tensor is float64 (exact there), float32 otherwise (exact for the
    half-precision types and float32)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def magnitude_threshold_reference(tensors: Sequence[Tensor], k: int) -> Threshold:
    """The k-th smallest magnitude (1-based) over all ``tensors``: concatenate, ``kthvalue``."""
    dtype = _compare_dtype(tensors)
    magnitudes = torch.cat([tensor.detach().abs().reshape(-1).to(dtype) for tensor in tensors])
    value = torch.kthvalue(magnitudes, k).values
    return Threshold(value, int((magnitudes < value).sum()), int((magnitudes == value).sum()))


def magnitude_threshold(tensors: Sequence[Tensor], k: int) -> Threshold:
    """The k-th smallest magnitude (1-based) over all ``tensors``, as a 0-d tensor (float64 when
    a tensor is float64, float32 otherwise).

    A radix select over the float32 bit patterns of the magnitudes: one histogram of the
    high 16 bits finds the bucket that holds the k-th value, a second histogram of the low
    15 bits inside that bucket finds the value. Memory stays at a few MB of temporaries.
    """
    total = sum(tensor.numel() for tensor in tensors)
    if not 1 <= k <= total:
        raise ValueError(f"k must be in [1, {total}] (the number of entries), got {k}")
    if not _supports_radix(tensors):
        return magnitude_threshold_reference(tensors, k)
    chunks = _chunks(tensors)
    device = chunks[0].device
    buffers = _Buffers(tensors)
    high = torch.zeros(1 << HIGH_BITS, dtype=torch.long, device=device)
    for chunk in chunks:
        index = buffers.high_bits(buffers.magnitude_bits(chunk))
        high.index_add_(0, index, buffers.ones[: chunk.numel()])
    cumulative = high.cumsum(0)
    bucket = int(torch.searchsorted(cumulative, torch.tensor(k, device=device)))
    below = int(cumulative[bucket - 1]) if bucket > 0 else 0
    low = torch.zeros(1 << LOW_BITS, dtype=torch.long, device=device)
    for chunk in chunks:
        bits = buffers.magnitude_bits(chunk)
        inside = torch.eq(buffers.high_bits(bits), bucket, out=buffers.flag[: chunk.numel()])
        low += torch.bincount(
            bits[inside].bitwise_and((1 << LOW_BITS) - 1), minlength=1 << LOW_BITS
        )
    low_cumulative = low.cumsum(0)
    position = int(torch.searchsorted(low_cumulative, torch.tensor(k - below, device=device)))
    pattern = torch.tensor((bucket << LOW_BITS) | position, dtype=torch.int32, device=device)
    before = int(low_cumulative[position - 1]) if position > 0 else 0
    return Threshold(pattern.view(torch.float32), below + before, int(low[position]))


def keep_largest(
    tensors: Sequence[Tensor], k: int, threshold: Threshold | None = None
) -> list[Tensor]:
    """Boolean masks that prune exactly the ``k`` smallest magnitudes over all ``tensors``.

    Every magnitude below the threshold is pruned, every one above is kept, and of those
    equal to it the first ones in the tensors' (flattened) order are pruned until ``k`` are.

    Args:
        tensors: the tensors to score (their magnitudes are the scores).
        k: how many entries to prune, in [0, total].
        threshold: the result of :func:`magnitude_threshold` for ``k``, if already known.

    Returns:
        One bool mask per tensor (True = keep), shaped like it.
    """
    total = sum(tensor.numel() for tensor in tensors)
    if not 0 <= k <= total:
        raise ValueError(f"k must be in [0, {total}] (the number of entries), got {k}")
    if k == 0:
        return [torch.ones_like(tensor, dtype=torch.bool) for tensor in tensors]
    if threshold is None and _supports_radix(tensors):
        masks = _keep_largest_bracketed(tensors, k)
        if masks is not None:
            return masks
    if threshold is None:
        threshold = magnitude_threshold(tensors, k)
    dtype = _compare_dtype(tensors)
    limit = threshold.value.to(dtype)
    masks = []
    buffers = _Buffers(tensors) if _supports_radix(tensors) else None
    limit_bits = int(limit.float().view(torch.int32))
    for tensor in tensors:
        mask = torch.empty(tensor.shape, dtype=torch.bool, device=tensor.device)
        for part, out in zip(
            tensor.detach().reshape(-1).split(CHUNK), mask.view(-1).split(CHUNK), strict=True
        ):
            if buffers is not None:  # compare the bits: exact, and no float temporaries
                torch.gt(buffers.magnitude_bits(part), limit_bits, out=out)
            else:
                torch.gt(part.abs().to(dtype), limit, out=out)
        masks.append(mask)
    # Entries equal to the threshold are pruned so far; keep those beyond the k-th.
    to_prune = k - threshold.below
    if to_prune < threshold.equal:
        for tensor, mask in zip(tensors, masks, strict=True):
            equal = tensor.detach().abs().to(dtype) == limit
            count = int(equal.sum())
            if to_prune >= count:
                to_prune -= count
                continue
            positions = equal.reshape(-1).nonzero().squeeze(1)[to_prune:]
            mask.view(-1)[positions] = True
            to_prune = 0
    return masks


SAMPLE = 1 << 18  # magnitudes sampled to bracket the k-th one
MARGIN = 5.0  # the bracket's half-width, in standard errors of the sampled quantile


def _sample_bracket(tensors: Sequence[Tensor], k: int, total: int) -> tuple[int, int]:
    """Bit patterns (lo, hi) of magnitudes that bracket the k-th smallest, from a sample."""
    generator = torch.Generator(device=tensors[0].device).manual_seed(0)
    parts = []
    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        count = min(tensor.numel(), -(-SAMPLE * tensor.numel() // total))
        index = torch.randint(tensor.numel(), (count,), generator=generator, device=tensor.device)
        parts.append(tensor.detach().reshape(-1)[index].float().abs())
    sample = torch.cat(parts)
    size = sample.numel()
    quantile = k / total
    spread = MARGIN * (quantile * (1 - quantile) / size) ** 0.5 + 2 / size
    low_rank = int((quantile - spread) * size)
    high_rank = int((quantile + spread) * size) + 1
    lo = int(torch.kthvalue(sample, low_rank).values.view(torch.int32)) if low_rank >= 1 else 0
    hi = (
        int(torch.kthvalue(sample, high_rank).values.view(torch.int32))
        if high_rank <= size
        else 0x7FFFFFFF
    )
    return lo, hi


def _keep_largest_bracketed(tensors: Sequence[Tensor], k: int) -> list[Tensor] | None:
    """One pass: keep every magnitude above a sampled bracket, collect those inside it.

    Entries with bits in [lo, hi] are candidates; a k-th value of the candidates (by
    magnitude, ties by position) says which are the k - below smallest. Returns None when the
    sample missed (the k-th magnitude lies outside the bracket), for the caller to fall back.
    """
    total = sum(tensor.numel() for tensor in tensors)
    lo, hi = _sample_bracket(tensors, k, total)
    buffers = _Buffers(tensors)
    masks: list[Tensor] = []
    candidates: list[Tensor] = []
    places: list[tuple[int, int, Tensor]] = []
    at_least_lo = 0
    for which, tensor in enumerate(tensors):
        mask = torch.empty(tensor.shape, dtype=torch.bool, device=tensor.device)
        offset = 0
        for part, out in zip(
            tensor.detach().reshape(-1).split(CHUNK), mask.view(-1).split(CHUNK), strict=True
        ):
            bits = buffers.magnitude_bits(part)
            torch.gt(bits, hi, out=out)
            flag = torch.ge(bits, lo, out=buffers.flag[: part.numel()])
            at_least_lo += int(torch.count_nonzero(flag))
            flag.logical_xor_(out)  # lo <= bits <= hi
            positions = flag.nonzero().squeeze(1)
            candidates.append(bits[positions])
            places.append((which, offset, positions))
            offset += part.numel()
        masks.append(mask)
    below = total - at_least_lo
    inside = sum(part.numel() for part in candidates)
    if not below < k <= below + inside:
        return None
    values = torch.cat(candidates)
    rank = k - below  # prune the `rank` smallest candidates, ties in position order
    value = torch.kthvalue(values, rank).values
    keep = values > value
    ties = (values == value).nonzero().squeeze(1)
    keep[ties[rank - int(torch.count_nonzero(values < value)) :]] = True
    start = 0
    for which, offset, positions in places:
        chosen = keep[start : start + positions.numel()]
        masks[which].view(-1)[positions[chosen] + offset] = True
        start += positions.numel()
    return masks


def keep_largest_in_groups(scores: Tensor, group: int, prune: int) -> Tensor:
    """Prune the ``prune`` lowest scores of every ``group`` consecutive entries of each row.

    A stable sort orders each group, so of equal scores the earlier entries are pruned first.
    """
    grouped = scores.reshape(scores.shape[0], -1, group)
    order = grouped.sort(dim=-1, stable=True).indices
    keep = torch.ones_like(grouped, dtype=torch.bool)
    keep.scatter_(-1, order[..., :prune], False)
    return keep.reshape(scores.shape)
