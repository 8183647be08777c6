"""One tensor's compressed layouts: bit for bit back, and the sizes the format promises."""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
import torch

from convergent.sparse.encoding import (
    EncodingError,
    decode_tensor,
    encode_tensor,
    pack_bits,
    pack_integers,
    subsets,
    unpack_bits,
    unpack_integers,
)
from convergent.sparse.masks import n_m_mask
from tests.conftest import CLEAR_REFS, status_bytes

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_of(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns (so -0.0 differs from 0.0, and NaN payloads count)."""
    return tensor.contiguous().view(BITS[tensor.element_size()])


def _unstructured(weight: torch.Tensor, keep: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return weight * (torch.rand(weight.shape, generator=generator) < keep)  # -0.0 where w < 0


def _patterns(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "dense": weight,
        "unstructured 50 %": _unstructured(weight, 0.5),
        "unstructured 90 %": _unstructured(weight, 0.1),
        "unstructured 99 %": _unstructured(weight, 0.01),
        "2:4": weight * n_m_mask(weight, 2, 4),
        "1:4": weight * n_m_mask(weight, 1, 4),
        "4:8": weight * n_m_mask(weight, 4, 8),
        "2:8 on Conv1D's inputs": weight * n_m_mask(weight, 2, 8, input_dim=0),
        "all zero": torch.zeros_like(weight),
        "all negative zero": -torch.zeros_like(weight),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_pattern_round_trips_bit_for_bit(dtype):
    weight = torch.randn(24, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    for name, tensor in _patterns(weight).items():
        group_dim = 0 if "Conv1D" in name else 1
        encoded = encode_tensor(tensor, group_dim)
        decoded = decode_tensor(encoded.entry, encoded.parts, name)
        assert decoded.dtype == dtype and decoded.shape == tensor.shape, name
        assert torch.equal(bits_of(decoded), bits_of(tensor)), name


def test_special_values_and_shapes_round_trip():
    weight = torch.randn(8, 16, 3)  # a convolution's [out, in, k], groups along dim 1
    weight[0, :4, 0] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    weight = weight * n_m_mask(weight, 2, 4)
    weight[1, 0, 0] = float("nan")
    for tensor in (weight, torch.randn(5, 7) * (torch.rand(5, 7) < 0.2), torch.randn(3)):
        encoded = encode_tensor(tensor)
        assert torch.equal(bits_of(decode_tensor(encoded.entry, encoded.parts)), bits_of(tensor))


def test_the_smallest_layout_is_chosen_with_the_sizes_the_format_states():
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(2))
    sparse = _unstructured(weight, 0.1).abs()  # positive zeros: no zero signs to store
    encoded = encode_tensor(sparse)
    nonzero = int((sparse != 0).sum())
    assert encoded.entry["kind"] == "bitmask"
    assert encoded.stored_bytes == math.ceil(64 * 64 / 8) + 4 * nonzero  # bits + float32 values
    two_four = (weight * n_m_mask(weight, 2, 4)).abs()
    encoded = encode_tensor(two_four)
    groups = 64 * 64 // 4
    rank_bits = math.ceil(math.log2(math.comb(4, 2)))  # 6 subsets: 3 bits a group
    assert (encoded.entry["kind"], encoded.entry["n"], encoded.entry["m"]) == ("n:m", 2, 4)
    assert encoded.stored_bytes == groups * 2 * 4 + math.ceil(groups * rank_bits / 8)
    # 1 % zeros: a bit per weight costs more than the float32 zeros it saves.
    dense = encode_tensor(_unstructured(weight, 0.99).abs())
    assert dense.entry["kind"] == "dense" and dense.stored_bytes == 64 * 64 * 4
    signed = encode_tensor(_unstructured(weight, 0.1))  # -0.0 where pruned weights were < 0
    zeros = int((_unstructured(weight, 0.1) == 0).sum())
    assert signed.stored_bytes == encode_tensor(sparse).stored_bytes + math.ceil(zeros / 8)


def test_bits_pack_as_numpy_packs_them_little_endian():
    bits = torch.rand(1003, generator=torch.Generator().manual_seed(3)) < 0.3
    expected = np.packbits(bits.numpy(), bitorder="little")
    assert np.array_equal(pack_bits(bits).numpy(), expected)
    assert torch.equal(unpack_bits(pack_bits(bits), 1003), bits)
    values = torch.randint(0, 70, (101,))
    assert torch.equal(unpack_integers(pack_integers(values, 7), 101, 7), values)


@pytest.mark.parametrize(("n", "m"), [(2, 4), (1, 4), (3, 8), (5, 16)])
def test_subset_ranks_follow_lexicographic_order(n, m):
    positions, ranks = subsets(n, m)
    expected = list(itertools.combinations(range(m), n))
    assert [tuple(row) for row in positions.tolist()] == expected
    for rank, chosen in enumerate(expected):
        assert int(ranks[sum(1 << p for p in chosen)]) == rank


def test_parts_that_do_not_fit_the_entry_are_refused():
    encoded = encode_tensor(torch.randn(8, 8) * (torch.rand(8, 8) < 0.1))
    parts = {**encoded.parts, "values": encoded.parts["values"][:-1]}
    with pytest.raises(EncodingError, match="values holds"):
        decode_tensor(encoded.entry, parts, "w")
    with pytest.raises(EncodingError, match="unknown kind"):
        decode_tensor({**encoded.entry, "kind": "zip"}, encoded.parts, "w")


def test_the_bitmask_copy_is_made_only_when_it_can_be_the_smaller(monkeypatch):
    import convergent.sparse.encoding as encoding

    built: list[int] = []
    bitmask = encoding._bitmask
    monkeypatch.setattr(encoding, "_bitmask", lambda *arguments: built.append(1) or
                        bitmask(*arguments))  # fmt: skip
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(3)).abs()
    # no zeros, or 1 %: values alone cost as much as dense, so the layout is dense, uncopied
    for kept in (1.0, 0.99):
        assert encode_tensor(_unstructured(weight, kept)).entry["kind"] == "dense"
    assert built == []
    # 1/32 of the entries zero saves exactly the bits' cost: a tie, which dense keeps
    tie = weight.clone().reshape(-1)
    tie[::32] = 0
    assert encode_tensor(tie.reshape(64, 64)).entry["kind"] == "dense"
    assert built == []
    assert encode_tensor(_unstructured(weight, 0.5)).entry["kind"] == "bitmask"
    assert built == [1]


@pytest.mark.skipif(not os.access(CLEAR_REFS, os.W_OK), reason="needs Linux's clear_refs")
@pytest.mark.parametrize("padding_row", [False, True])
def test_a_dense_table_is_stored_as_it_is_without_building_copies(padding_row):
    # A dense embedding table (written last by a streamed prune; its padding token's row may
    # be zero): no layout beats dense, so none is built. Counting its nonzeros, its zeros'
    # signs and its N:M groups' nonzeros through bool and int64 temporaries used to allocate
    # 2.5 (padding row) and 3.0 (no zero) times the table (measured).
    table = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) + 10.0
    if padding_row:
        table[0] = 0.0
    size = table.numel() * table.element_size()  # 64 MiB: fresh mmap'd memory, exactly counted
    with open(CLEAR_REFS, "w") as clear:
        clear.write("5")
    before = status_bytes("VmRSS")
    encoded = encode_tensor(table)
    peak = status_bytes("VmHWM") - before
    assert encoded.entry["kind"] == "dense"
    assert encoded.entry["nonzero"] == table.numel() - (4096 if padding_row else 0)
    assert encoded.parts["dense"].data_ptr() == table.data_ptr()  # the table itself, no copy
    assert peak < 0.05 * size, f"peak {peak / size:.2f} of the table"


@pytest.mark.parametrize(("n", "m"), [(2, 4), (1, 4), (2, 8)])
def test_a_convolution_weight_groups_along_its_input_channels(n, m):
    # [out, in, kh, kw]: groups of M consecutive input channels at each (out, kh, kw); the
    # kernel's last dimension (4) also divides by 4, so grouping along it would encode too.
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(3, 16, 2, 4, generator=generator)
    kept = torch.zeros_like(weight, dtype=torch.bool)
    expected_values = []
    for out, row, column in itertools.product(range(3), range(2), range(4)):
        for start in range(0, 16, m):
            chosen = sorted(torch.randperm(m, generator=generator)[:n].tolist())
            for position in chosen:
                kept[out, start + position, row, column] = True
                expected_values.append(float(weight[out, start + position, row, column]))
    tensor = torch.where(kept, weight, torch.zeros_like(weight))
    encoded = encode_tensor(tensor, group_dim=1)
    assert (encoded.entry["kind"], encoded.entry["n"], encoded.entry["m"]) == ("n:m", n, m)
    assert encoded.entry["group_dim"] == 1
    # the values in (out, kh, kw, group) order, each group's kept ones by channel
    assert encoded.parts["values"].tolist() == expected_values
    decoded = decode_tensor(encoded.entry, encoded.parts, "conv")
    assert torch.equal(bits_of(decoded), bits_of(tensor))
