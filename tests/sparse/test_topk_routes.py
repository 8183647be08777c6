"""Top-k masks by every route, against a stable sort written here.

`keep_largest` has three routes to the same masks: the one-pass bracket (a sample of the
magnitudes brackets the k-th one), the threshold route (a given or radix-selected threshold,
then ties broken in position order) and the fallback from a missed bracket to the radix
select. The documented rule is checked on each: the ``k`` smallest magnitudes are pruned, and
among magnitudes equal to the k-th the first ones in the tensors' flattened order go first.
A stable ascending sort of the magnitudes (float64, exact for every input dtype) gives that
answer independently. Where a route is a choice of speed (the bracket, the chunking), the test
also proves which route ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor

from convergent.sparse import keep_largest, magnitude_threshold, topk

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SMALL_CHUNK = 1 << 12  # larger than every small test tensor: one chunk each, cheap buffers


@pytest.fixture
def one_chunk(monkeypatch):
    """Chunks of 4,096: the small tensors here fit one, and the scratch buffers stay small.

    The module's own chunk (4,194,304) is exercised by the large tests below.
    """
    monkeypatch.setattr(topk, "CHUNK", SMALL_CHUNK)


def sorted_order(tensors: Sequence[Tensor]) -> Tensor:
    """Flat positions by magnitude, ties in position order (stable sort, exact in float64)."""
    magnitudes = torch.cat([t.detach().reshape(-1).double().abs() for t in tensors])
    return torch.sort(magnitudes, stable=True).indices


def expected_masks(tensors: Sequence[Tensor], k: int, order: Tensor | None = None) -> list[Tensor]:
    order = sorted_order(tensors) if order is None else order
    keep = torch.ones(order.numel(), dtype=torch.bool)
    keep[order[:k]] = False
    parts = keep.split([t.numel() for t in tensors])
    return [part.reshape(t.shape) for part, t in zip(parts, tensors, strict=True)]


def assert_masks_equal(got: list[Tensor], want: list[Tensor], note: object = "") -> None:
    assert len(got) == len(want), note
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == torch.bool, (note, index, a.dtype)
        assert a.shape == b.shape, (note, index)
        assert torch.equal(a, b), (note, index, int((a != b).sum()))


def magnitude_bits(tensors: Sequence[Tensor]) -> Tensor:
    """The float32 bit patterns of every magnitude (the module's radix key, computed here)."""
    return torch.cat([t.detach().reshape(-1).float().abs().view(torch.int32) for t in tensors])


def _ties(dtype: torch.dtype) -> list[Tensor]:
    # Integers in [-3, 3] (every dtype holds them exactly): heavy ties at every threshold,
    # spread over four tensors of unequal, odd sizes; some zeros are negative zeros.
    generator = torch.Generator().manual_seed(11)
    shapes = [(13, 7), (5,), (3, 4, 5), (17,)]
    tensors = [torch.randint(-3, 4, shape, generator=generator).float() for shape in shapes]
    tensors[0].view(-1)[::9] = -0.0
    tensors[2].view(-1)[1::7] = -0.0
    return [t.to(dtype) for t in tensors]


def _spread(dtype: torch.dtype) -> list[Tensor]:
    # Continuous magnitudes over six decades plus exact zeros, signed zeros and infinities,
    # rounded to ``dtype`` first so that the float64 copy is exactly what the module sees.
    generator = torch.Generator().manual_seed(3)
    tensors = [
        torch.randn(37, 29, generator=generator) * 1e-3,
        torch.randn(401, generator=generator),
        torch.randn(6, 50, generator=generator) * 300.0,
        torch.tensor([0.0, -0.0, 0.0, float("inf"), -float("inf"), -0.0, 1.0, -1.0]),
    ]
    return [t.to(dtype) for t in tensors]


DATA: dict[str, Callable[[torch.dtype], list[Tensor]]] = {"ties": _ties, "spread": _spread}


def _k_grid(tensors: Sequence[Tensor]) -> list[int]:
    total = sum(t.numel() for t in tensors)
    return sorted({0, 1, 2, 7, total // 5, total // 3, total // 2, total - 9, total - 1, total})


class RouteSpy:
    """Counts the fallbacks to the radix select and what the one-pass route returned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.thresholds = 0
        self.one_pass: list[bool] = []
        threshold, one_pass = topk.magnitude_threshold, topk._keep_largest_bracketed

        def counting_threshold(*args, **kwargs):
            self.thresholds += 1
            return threshold(*args, **kwargs)

        def recording_one_pass(*args, **kwargs):
            masks = one_pass(*args, **kwargs)
            self.one_pass.append(masks is not None)
            return masks

        monkeypatch.setattr(topk, "magnitude_threshold", counting_threshold)
        monkeypatch.setattr(topk, "_keep_largest_bracketed", recording_one_pass)


@pytest.mark.parametrize("chunk", [SMALL_CHUNK, 7], ids=["one-chunk", "chunks-of-7"])
@pytest.mark.parametrize("route", ["one-pass", "given-threshold", "fallback"])
@pytest.mark.parametrize("data", sorted(DATA))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_route_prunes_the_k_smallest_ties_in_position_order(
    monkeypatch, dtype, data, route, chunk
):
    monkeypatch.setattr(topk, "CHUNK", chunk)  # 7: several chunks, none a multiple of 7 long
    if route == "fallback":  # the one pass reports a miss; the radix select must settle it
        monkeypatch.setattr(topk, "_keep_largest_bracketed", lambda tensors, k: None)
    tensors = DATA[data](dtype)
    before = [t.clone() for t in tensors]
    order = sorted_order(tensors)
    for k in _k_grid(tensors):
        threshold = magnitude_threshold(tensors, k) if route == "given-threshold" and k else None
        masks = keep_largest(tensors, k, threshold)
        assert_masks_equal(masks, expected_masks(tensors, k, order), (route, k))
    for tensor, original in zip(tensors, before, strict=True):
        assert torch.equal(tensor, original)  # the scores are read, never written


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_tensor_and_one_entry(one_chunk, dtype):
    # A single tensor on every route (the buffers' device comes from the first tensor).
    single = [torch.tensor([[3.0, -1.0, 2.0], [-1.0, 0.5, -0.0]], dtype=dtype)]
    for k in range(7):
        want = expected_masks(single, k)
        assert_masks_equal(keep_largest(single, k), want, k)
        if k:
            assert_masks_equal(keep_largest(single, k, magnitude_threshold(single, k)), want, k)
    one = [torch.tensor([-2.5], dtype=dtype)]
    assert keep_largest(one, 0)[0].tolist() == [True]
    assert keep_largest(one, 1)[0].tolist() == [False]
    assert keep_largest(one, 1, magnitude_threshold(one, 1))[0].tolist() == [False]


def test_k_zero_keeps_everything_as_bool_masks_shaped_like_the_tensors(one_chunk):
    tensors = [torch.randn(3, 4, dtype=torch.float64), torch.randn(5).half(), torch.zeros(2, 1)]
    masks = keep_largest(tensors, 0)
    assert [m.dtype for m in masks] == [torch.bool] * 3
    assert [m.shape for m in masks] == [t.shape for t in tensors]
    assert all(bool(m.all()) for m in masks)


def test_out_of_range_k_names_the_value_and_the_range(one_chunk):
    tensors = [torch.randn(3, 2), torch.randn(6)]
    with pytest.raises(
        ValueError, match=r"^k must be in \[0, 12\] \(the number of entries\), got -1$"
    ):
        keep_largest(tensors, -1)
    with pytest.raises(
        ValueError, match=r"^k must be in \[0, 12\] \(the number of entries\), got 13$"
    ):
        keep_largest(tensors, 13)
    with pytest.raises(
        ValueError, match=r"^k must be in \[1, 12\] \(the number of entries\), got 0$"
    ):
        magnitude_threshold(tensors, 0)
    with pytest.raises(
        ValueError, match=r"^k must be in \[1, 12\] \(the number of entries\), got 13$"
    ):
        magnitude_threshold(tensors, 13)
    assert keep_largest(tensors, 12)[1].sum() == 0  # both ends of the range are allowed
    assert magnitude_threshold(tensors, 12).below == 11


def _large(dtype: torch.dtype = torch.float32) -> list[Tensor]:
    # 600,007 magnitudes (more than the 2^18 sampled), in three tensors of different scales.
    generator = torch.Generator().manual_seed(7)
    tensors = [
        torch.randn(400_000, generator=generator),
        torch.randn(1_500, 100, generator=generator) * 3.0,
        torch.randn(50_007, generator=generator) * 0.1,
    ]
    return [t.to(dtype) for t in tensors]


LARGE_QUANTILES = [0.0, 1e-4, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_one_pass_route_settles_benign_data_without_a_fallback(monkeypatch, dtype):
    tensors = _large(dtype)
    total = sum(t.numel() for t in tensors)
    order = sorted_order(tensors)
    spy = RouteSpy(monkeypatch)
    for q in LARGE_QUANTILES:
        k = min(max(round(q * total), 1), total)
        masks = keep_largest(tensors, k)
        assert_masks_equal(masks, expected_masks(tensors, k, order), q)
    assert spy.one_pass == [True] * len(LARGE_QUANTILES)
    assert spy.thresholds == 0
    # A threshold that is already known skips the sample and the one pass.
    spy.thresholds = 0
    keep_largest(tensors, total // 2, magnitude_threshold(tensors, total // 2))
    assert len(spy.one_pass) == len(LARGE_QUANTILES)
    # float64 is never read as float32 bits by the one pass: it takes the reference route.
    keep_largest([t.double() for t in tensors], total // 2)
    assert len(spy.one_pass) == len(LARGE_QUANTILES) and spy.thresholds == 1


@pytest.mark.parametrize("q", [0.01, 0.1, 0.5, 0.9, 0.99])
def test_the_sampled_bracket_holds_the_kth_magnitude_and_is_as_narrow_as_designed(q):
    # Designed half-width: 5 standard errors of the q-quantile of a 2^18-entry sample, so the
    # bracket holds about 2 * 5 * sqrt(q (1 - q) / 2^18) of all entries (the sample's own
    # error moves that by a few per cent; 0.75 and 1.3 are more than six of its deviations).
    tensors = _large()
    total = sum(t.numel() for t in tensors)
    k = round(q * total)
    lo, hi = topk._sample_bracket(tensors, k, total)
    bits = magnitude_bits(tensors)
    kth = int(torch.sort(bits).values[k - 1])
    assert lo <= kth <= hi
    inside = int(((bits >= lo) & (bits <= hi)).sum())
    designed = 2 * 5 * math.sqrt(q * (1 - q) / 2**18) * total
    assert 0.75 * designed <= inside <= 1.3 * designed, inside / designed


def test_the_bracket_at_the_extremes_reaches_zero_and_the_largest_pattern():
    tensors = _large()
    total = sum(t.numel() for t in tensors)
    bits = magnitude_bits(tensors)
    lo, hi = topk._sample_bracket(tensors, 1, total)
    assert lo == 0 and int(bits.min()) <= hi < int(torch.sort(bits).values[100])
    lo, hi = topk._sample_bracket(tensors, total, total)
    assert hi == 0x7FFFFFFF and int(torch.sort(bits).values[-100]) < lo <= int(bits.max())


def test_pruning_neither_reads_nor_advances_the_global_random_stream(one_chunk):
    tensors = _spread(torch.float32)
    torch.manual_seed(123)
    untouched = torch.rand(4)
    first = keep_largest(tensors, 100)
    torch.manual_seed(123)
    keep_largest(tensors, 100)
    assert torch.equal(torch.rand(4), untouched)
    torch.manual_seed(999)  # a different global state gives the same masks
    assert_masks_equal(keep_largest(tensors, 100), first)


def _forced_bracket(monkeypatch, lo: int, hi: int) -> None:
    monkeypatch.setattr(topk, "_sample_bracket", lambda tensors, k, total: (lo, hi))


@pytest.mark.parametrize(
    "case, falls_back",
    [
        ("everything", False),  # [0, max]: every entry is a candidate
        ("k-th at the top", False),  # k == below + inside: the k-th is the last candidate
        ("k-th at the bottom", False),  # below == k - 1: the k-th is the first candidate
        ("k-th just below", True),  # below == k: the k-th lies under the bracket
        ("k-th just above", True),  # below + inside == k - 1: the k-th lies over it
    ],
)
def test_a_bracket_that_misses_falls_back_and_one_that_holds_does_not(
    monkeypatch, case, falls_back
):
    generator = torch.Generator().manual_seed(1)
    tensors = [torch.randn(300, generator=generator), torch.randn(20, 11, generator=generator)]
    k = 171
    sorted_bits = torch.sort(magnitude_bits(tensors)).values  # distinct magnitudes
    assert len(set(sorted_bits.tolist())) == sorted_bits.numel()
    at = lambda rank: int(sorted_bits[rank - 1])  # noqa: E731  (1-based rank)
    lo, hi = {
        "everything": (0, 0x7FFFFFFF),
        "k-th at the top": (at(k - 40), at(k)),
        "k-th at the bottom": (at(k), at(k + 40)),
        "k-th just below": (at(k + 1), at(k + 40)),
        "k-th just above": (at(k - 40), at(k - 1)),
    }[case]
    _forced_bracket(monkeypatch, lo, hi)
    spy = RouteSpy(monkeypatch)
    masks = keep_largest(tensors, k)
    assert_masks_equal(masks, expected_masks(tensors, k))
    assert spy.one_pass == [not falls_back]
    assert spy.thresholds == int(falls_back)


def test_a_bracket_inside_one_run_of_ties_settles_it_in_position_order(monkeypatch):
    # The bracket holds only the tied value, spread over three tensors: the pruned ties are
    # the first in flattened order, across tensor and chunk boundaries.
    monkeypatch.setattr(topk, "CHUNK", 5)
    tensors = _ties(torch.float32)
    two = int(torch.tensor(2.0).view(torch.int32))
    _forced_bracket(monkeypatch, two, two)
    spy = RouteSpy(monkeypatch)
    magnitudes = torch.cat([t.reshape(-1).abs() for t in tensors])
    below, equal = int((magnitudes < 2).sum()), int((magnitudes == 2).sum())
    for k in (below + 1, below + 2, below + equal // 2, below + equal - 1, below + equal):
        assert_masks_equal(keep_largest(tensors, k), expected_masks(tensors, k), k)
    assert spy.one_pass == [True] * 5 and spy.thresholds == 0


def test_heavy_tails_and_one_dominant_value_still_give_the_exact_masks():
    # Adversarial for a sample: 90 % of the entries share one magnitude, the rest follow a
    # cubed Cauchy tail over twenty decades. Whatever the bracket does, the masks are exact.
    generator = torch.Generator().manual_seed(2)
    uniform = torch.rand(30_000, generator=generator, dtype=torch.float64)
    tail = (torch.tan(math.pi * (uniform - 0.5)) ** 3).float()
    mixed = torch.cat([torch.full((270_000,), 0.75), tail])
    mixed = mixed[torch.randperm(mixed.numel(), generator=generator)]
    tensors = [mixed[:123_457].reshape(-1, 1), mixed[123_457:]]
    total = mixed.numel()
    below, equal = int((mixed.abs() < 0.75).sum()), int((mixed.abs() == 0.75).sum())
    assert equal >= 270_000 and 0 < below < 20_000
    order = sorted_order(tensors)
    for k in (1, below, below + 1, below + equal // 2, below + equal, below + equal + 1, total):
        assert_masks_equal(keep_largest(tensors, k), expected_masks(tensors, k, order), k)


def _subnormal_buckets() -> list[Tensor]:
    # Magnitudes whose float32 bits fall in radix bucket 0 (zeros, subnormals < 2^15 ulps)
    # and bucket 1, and values whose low 15 bits are 0 (1.0, 2.0) or 1 (the next float).
    tiny = torch.tensor([1, 3, 40_000, 40_001, 32_767, 32_768], dtype=torch.int32)
    subnormals = tiny.view(torch.float32)
    one_up = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    return [
        torch.cat([torch.tensor([0.0, -0.0, 1.0]), subnormals, -subnormals[:2]]),
        torch.tensor([1.0, -1.0, 2.0, 0.0]),
        torch.stack([one_up, -one_up, torch.tensor(3.0), torch.tensor(-0.5)]),
        torch.randn(9, generator=torch.Generator().manual_seed(4)),
    ]


@pytest.mark.parametrize("chunk", [SMALL_CHUNK, 3], ids=["one-chunk", "chunks-of-3"])
def test_radix_threshold_at_every_k_over_bucket_and_bit_edges(monkeypatch, chunk):
    monkeypatch.setattr(topk, "CHUNK", chunk)
    tensors = _subnormal_buckets()
    magnitudes = torch.cat([t.reshape(-1).double().abs() for t in tensors])
    ordered = torch.sort(magnitudes).values
    for k in range(1, magnitudes.numel() + 1):
        found = magnitude_threshold(tensors, k)
        value = ordered[k - 1]
        assert found.value.dtype == torch.float32 and found.value.ndim == 0
        assert float(found.value) == float(value), k
        assert found.below == int((magnitudes < value).sum()), k
        assert found.equal == int((magnitudes == value).sum()), k
        assert_masks_equal(keep_largest(tensors, k), expected_masks(tensors, k), k)
        assert_masks_equal(keep_largest(tensors, k, found), expected_masks(tensors, k), k)


def test_the_radix_select_never_concatenates_and_float64_always_does(monkeypatch, one_chunk):
    # The radix select reads the tensors in place (a few MB of scratch); the reference
    # route concatenates a float32 copy of everything, which only float64 needs.
    calls = []
    reference = topk.magnitude_threshold_reference

    def counting_reference(tensors, k):
        calls.append([t.dtype for t in tensors])
        return reference(tensors, k)

    monkeypatch.setattr(topk, "magnitude_threshold_reference", counting_reference)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tensors = _spread(dtype)
        magnitude_threshold(tensors, 100)
        keep_largest(tensors, 100, magnitude_threshold(tensors, 100))
    assert calls == []
    mixed = _spread(torch.float32)[:2] + _spread(torch.float64)[2:]
    magnitude_threshold(mixed, 100)
    keep_largest(_spread(torch.float64), 100)
    assert calls == [[torch.float32] * 2 + [torch.float64] * 2, [torch.float64] * 4]


def test_counts_beyond_float32_integer_precision_stay_exact():
    # 2^24 + 3 zeros share one radix bucket: a float32 histogram would round that count
    # (a model already half sparse has this many zeros once it passes 34M weights).
    zeros = 2**24 + 3
    tensors = [torch.zeros(zeros), torch.tensor([1.0, -2.0, 1.0])]
    last_zero = magnitude_threshold(tensors, zeros)
    assert (float(last_zero.value), last_zero.below, last_zero.equal) == (0.0, 0, zeros)
    first_one = magnitude_threshold(tensors, zeros + 1)
    assert (float(first_one.value), first_one.below, first_one.equal) == (1.0, zeros, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_radix_threshold_counts_below_and_equal_for_every_dtype(one_chunk, dtype):
    tensors = _ties(dtype) + _spread(dtype)
    magnitudes = torch.cat([t.reshape(-1).double().abs() for t in tensors])
    ordered = torch.sort(magnitudes).values
    for k in _k_grid(tensors)[1:]:
        found = magnitude_threshold(tensors, k)
        value = ordered[k - 1]
        assert float(found.value) == float(value), k
        assert (found.below, found.equal) == (
            int((magnitudes < value).sum()),
            int((magnitudes == value).sum()),
        ), k


def test_a_float64_default_dtype_changes_nothing(one_chunk):
    # Some numerics set float64 as the default dtype; the float32 scratch must stay float32.
    tensors = [t.to(torch.bfloat16) for t in _spread(torch.float32)] + _ties(torch.float16)
    total = sum(t.numel() for t in tensors)
    wants = {k: expected_masks(tensors, k) for k in (1, total // 2, total - 1)}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for k, want in wants.items():
            assert_masks_equal(keep_largest(tensors, k), want, k)
            assert_masks_equal(keep_largest(tensors, k, magnitude_threshold(tensors, k)), want, k)
    finally:
        torch.set_default_dtype(previous)


def test_real_chunk_boundaries_with_ties_across_them():
    # One tensor longer than a chunk (4,194,304 entries), not a multiple of it, with values
    # rounded to one decimal so the tied threshold value straddles the chunk boundary.
    generator = torch.Generator().manual_seed(8)
    long = (torch.randn(topk.CHUNK + 1_234, generator=generator) * 3).round(decimals=1)
    tensors = [torch.randn(999, generator=generator).round(decimals=1), long]
    total = sum(t.numel() for t in tensors)
    order = sorted_order(tensors)
    for k in (total // 2, total - 700):
        want = expected_masks(tensors, k, order)
        assert_masks_equal(keep_largest(tensors, k), want, k)
        assert_masks_equal(keep_largest(tensors, k, magnitude_threshold(tensors, k)), want, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_route_on_cuda_matches_the_cpu_answer(monkeypatch):
    tensors = [t.cuda() for t in _ties(torch.float32) + _spread(torch.bfloat16)]
    cpu = [t.cpu() for t in tensors]
    for k in _k_grid(cpu):
        want = expected_masks(cpu, k)
        threshold = magnitude_threshold(tensors, k) if k else None
        for masks in (keep_largest(tensors, k), keep_largest(tensors, k, threshold)):
            assert all(m.device == tensors[0].device for m in masks)
            assert_masks_equal([m.cpu() for m in masks], want, k)


def test_an_empty_tensor_among_the_scores_is_allowed(one_chunk):
    tensors = [torch.empty(0), torch.tensor([3.0, -1.0, 2.0])]
    assert_masks_equal(keep_largest(tensors, 1), expected_masks(tensors, 1))


def test_float64_magnitudes_closer_than_float32_resolution_are_ranked_exactly(one_chunk):
    tensors = [torch.tensor([1.0 + 1e-12, 1.0, 1.0 + 2e-12], dtype=torch.float64)]
    assert_masks_equal(keep_largest(tensors, 1), expected_masks(tensors, 1))
