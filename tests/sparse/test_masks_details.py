"""Masks in detail: N:M and pattern validation, the builders' defaults, sparsity accounting,
device moves, state loading, and the broadcast outside and inside a (simulated) process group.

Expected masks come from a per-group sort written here; the real two-process broadcast is
covered by ``tests/sparse/test_distributed.py`` (marked ``distributed``).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

from convergent.sparse import (
    Masks,
    MaskSpec,
    global_magnitude_masks,
    magnitude_masks,
    n_m_mask,
    n_m_masks,
    parse_pattern,
    uniform_magnitude_masks,
)
from convergent.sparse import masks as masks_module
from convergent.sparse.masks import check_sparsity


def expected_n_m(weight: Tensor, n: int, m: int, input_dim: int) -> Tensor:
    """Keep the n largest of each m consecutive entries along input_dim (ceil for a short tail)."""
    rows = weight.abs().movedim(input_dim, -1).reshape(-1, weight.shape[input_dim])
    keep = torch.zeros_like(rows, dtype=torch.bool)
    for row in range(rows.shape[0]):
        for start in range(0, rows.shape[1], m):
            group = rows[row, start : start + m]
            count = n if group.numel() == m else -(-n * group.numel() // m)
            keep[row, start + torch.argsort(group, descending=True)[:count]] = True
    moved = weight.movedim(input_dim, -1).shape
    return keep.reshape(moved).movedim(-1, input_dim)


def _distinct(*shape: int, seed: int = 0) -> Tensor:
    # Distinct magnitudes, so every N:M choice is unique.
    generator = torch.Generator().manual_seed(seed)
    count = torch.Size(shape).numel()
    values = (torch.randperm(count, generator=generator).float() + 1) / count
    signs = torch.randint(0, 2, (count,), generator=generator) * 2 - 1
    return (values * signs).reshape(shape)


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (3, 8), (1, 1), (5, 7)])
@pytest.mark.parametrize("shape,input_dim", [((4, 3, 10), 1), ((3, 10, 5), 2), ((6, 2, 3), 0)])
def test_n_m_on_three_dimensional_weights_along_any_dimension(shape, input_dim, n, m):
    weight = _distinct(*shape)
    mask = n_m_mask(weight, n, m, input_dim=input_dim)
    assert mask.dtype == torch.bool and mask.shape == weight.shape and mask.is_contiguous()
    assert torch.equal(mask, expected_n_m(weight, n, m, input_dim))


def test_n_m_defaults_to_the_second_dimension():
    weight = _distinct(6, 10)
    assert torch.equal(n_m_mask(weight, 2, 4), expected_n_m(weight, 2, 4, 1))
    conv = _distinct(4, 6, 3)
    assert torch.equal(n_m_mask(conv, 1, 4), expected_n_m(conv, 1, 4, 1))


@pytest.mark.parametrize(
    "n,m,message",
    [
        (0, 4, "N=0, M=4"),
        (5, 4, "N=5, M=4"),
        (2.0, 4, "N=2.0, M=4"),
        (2, 4.0, "N=2, M=4.0"),
        (-1, 4, "N=-1, M=4"),
    ],
)
def test_n_m_rejects_a_bad_n_or_m_naming_both(n, m, message):
    expected = re.escape(f"N:M needs integers 1 <= N <= M, got {message}")
    with pytest.raises(ValueError, match=f"^{expected}$"):
        n_m_mask(_distinct(4, 8), n, m)


def test_n_m_rejects_a_vector_and_a_dimension_out_of_range_naming_the_range():
    with pytest.raises(
        ValueError, match=r"^N:M masks need a weight with ndim >= 2, got shape \(8,\)$"
    ):
        n_m_mask(_distinct(8), 2, 4)
    with pytest.raises(ValueError, match=r"^input_dim must be in \[0, 1\], got 2$"):
        n_m_mask(_distinct(4, 8), 2, 4, input_dim=2)
    with pytest.raises(ValueError, match=r"^input_dim must be in \[0, 2\], got -1$"):
        n_m_mask(_distinct(4, 8, 2), 2, 4, input_dim=-1)
    assert n_m_mask(_distinct(4, 8, 2), 2, 4, input_dim=2).shape == (4, 8, 2)  # ndim - 1 is fine


def test_n_m_masks_use_dimension_one_unless_told_otherwise():
    tensors = {"a": _distinct(4, 3, 9, seed=1), "b": _distinct(8, 6, seed=2), "c": _distinct(5, 8)}
    default = n_m_masks(tensors, 2, 4)
    assert list(default) == ["a", "b", "c"]
    for name, weight in tensors.items():
        assert torch.equal(default[name], expected_n_m(weight, 2, 4, 1)), name
    mixed = n_m_masks(tensors, 1, 4, input_dims={"a": 2, "b": 0})
    assert torch.equal(mixed["a"], expected_n_m(tensors["a"], 1, 4, 2))
    assert torch.equal(mixed["b"], expected_n_m(tensors["b"], 1, 4, 0))
    assert torch.equal(mixed["c"], expected_n_m(tensors["c"], 1, 4, 1))


@pytest.mark.parametrize(
    "pattern,parsed",
    [
        ("unstructured", None),
        ("2:4", (2, 4)),
        ("1:4", (1, 4)),
        ("4:4", (4, 4)),
        ("3:8", (3, 8)),
        (" 2 : 4 ", (2, 4)),
        ("1:1", (1, 1)),
        ("16:32", (16, 32)),
    ],
)
def test_parse_pattern_reads_n_and_m(pattern, parsed):
    assert parse_pattern(pattern) == parsed


@pytest.mark.parametrize(
    "pattern",
    ["UNSTRUCTURED", "2:4:8", "0:4", "5:4", "2-4", "a:b", "2:", ":4", "", "2:4.0", "-1:4"],
)
def test_parse_pattern_rejects_anything_else_quoting_it(pattern):
    expected = re.escape(
        f"pattern must be 'unstructured' or 'N:M' with 1 <= N <= M, got {pattern!r}"
    )
    with pytest.raises(ValueError, match=f"^{expected}$"):
        parse_pattern(pattern)


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Linear(8, 4, bias=False)
        self.large = nn.Linear(4, 8, bias=False)
        with torch.no_grad():  # different scales: global and uniform masks differ
            self.small.weight.copy_(_distinct(4, 8, seed=3) * 0.01)
            self.large.weight.copy_(_distinct(8, 4, seed=4))


NAMES = ["small.weight", "large.weight"]


def _magnitudes(model: nn.Module) -> Tensor:
    return torch.cat([dict(model.named_parameters())[n].detach().abs().reshape(-1) for n in NAMES])


def test_magnitude_masks_default_to_half_uniform_unstructured():
    model = TwoLayers()
    masks = magnitude_masks(model, NAMES)  # MaskSpec(): uniform, the same half of each tensor
    for name in NAMES:
        magnitudes = dict(model.named_parameters())[name].detach().abs().reshape(-1)
        expected = torch.ones_like(magnitudes, dtype=torch.bool)
        expected[torch.argsort(magnitudes)[: round(0.5 * magnitudes.numel())]] = False
        assert torch.equal(masks[name].reshape(-1), expected)


def test_global_magnitude_masks_prune_half_under_one_threshold():
    model = TwoLayers()
    masks = magnitude_masks(model, NAMES, 0.5, MaskSpec(distribution="global"))
    assert list(masks) == NAMES
    magnitudes = _magnitudes(model)
    kept = torch.cat([masks[n].reshape(-1) for n in NAMES])
    expected = torch.ones(64, dtype=torch.bool)
    expected[torch.argsort(magnitudes)[:32]] = False  # one global threshold, 32 of 64 pruned
    assert torch.equal(kept, expected)
    assert int(masks["small.weight"].sum()) == 0  # every small-scale weight is below it


def test_magnitude_masks_uniform_and_n_m_routes():
    model = TwoLayers()
    uniform = magnitude_masks(model, NAMES, 0.25, MaskSpec(distribution="uniform"))
    for name in NAMES:
        weight = dict(model.named_parameters())[name].detach().abs().reshape(-1)
        expected = torch.ones_like(weight, dtype=torch.bool)
        expected[torch.argsort(weight)[: round(0.25 * weight.numel())]] = False
        assert torch.equal(uniform[name].reshape(-1), expected), name
    along_rows = magnitude_masks(model, NAMES, 0.5, MaskSpec(pattern="1:4"), {"large.weight": 0})
    assert torch.equal(along_rows["small.weight"], expected_n_m(model.small.weight, 1, 4, 1))
    assert torch.equal(along_rows["large.weight"], expected_n_m(model.large.weight, 1, 4, 0))
    two_four = magnitude_masks(
        model, NAMES, 0.9, MaskSpec(pattern="2:4")
    )  # N:M ignores the sparsity
    assert two_four.sparsity() == 0.5


def test_magnitude_masks_reject_an_unknown_distribution_and_missing_parameters():
    model = TwoLayers()
    with pytest.raises(
        ValueError,
        match=r"^distribution must be one of \('global', 'uniform', 'owl'\), got 'layerwise'$",
    ):
        MaskSpec(distribution="layerwise")
    missing = ["a", "b", "c", "d", "e", "f"]
    with pytest.raises(KeyError) as caught:
        magnitude_masks(model, [*NAMES, *missing])
    assert caught.value.args == ("the model has no parameter(s) ['a', 'b', 'c', 'd', 'e']",)


def _bool(values: list) -> Tensor:
    return torch.tensor(values, dtype=torch.bool)


def test_sparsity_counts_pruned_entries_including_edge_sizes():
    assert Masks({}).sparsity() == 0.0
    assert Masks({"w": _bool([0])}).sparsity() == 1.0
    assert Masks({"w": _bool([1])}).sparsity() == 0.0
    masks = Masks({"a": _bool([[1, 0], [0, 0]]), "b": _bool([1, 1, 1, 0]), "c": _bool([0])})
    assert masks.sparsity() == pytest.approx(5 / 9)
    assert masks.per_parameter_sparsity() == {
        "a": pytest.approx(0.75),
        "b": pytest.approx(0.25),
        "c": 1.0,
    }
    assert Masks({"d": _bool([1, 0, 0]), "e": _bool([1])}).per_parameter_sparsity() == {
        "d": pytest.approx(2 / 3),
        "e": 0.0,
    }


def test_membership_and_moves_keep_names_values_and_the_original():
    masks = Masks({"a": _bool([1, 0]), "b": _bool([0, 1, 1])})
    assert "a" in masks and "b" in masks
    assert "c" not in masks and 3 not in masks
    moved = masks.to("meta")
    assert list(moved) == ["a", "b"]
    assert all(moved[n].device.type == "meta" and moved[n].dtype == torch.bool for n in moved)
    assert moved["b"].shape == (3,)
    assert masks["a"].device.type == "cpu" and masks["a"].tolist() == [True, False]


def test_load_state_dict_keeps_each_current_device_and_replaces_the_names():
    masks = Masks({"a": _bool([1, 1]).to("meta"), "b": _bool([1])})
    masks.load_state_dict({"a": _bool([0, 1]), "c": _bool([1, 0, 1])})
    assert list(masks) == ["a", "c"]  # "b" is gone: the state replaces the masks
    assert masks["a"].device.type == "meta"  # an existing name keeps its device
    assert masks["c"].device.type == "cpu" and masks["c"].tolist() == [True, False, True]
    with pytest.raises(TypeError, match="bool"):
        masks.load_state_dict({"a": torch.ones(2)})


def test_broadcast_is_a_no_op_without_a_process_group():
    assert not torch.distributed.is_initialized()
    masks = Masks({"a": _bool([1, 0]), "b": _bool([0, 0, 1])})
    held = masks["a"]
    masks.broadcast()
    masks.broadcast(source=1)
    assert masks["a"] is held and masks["b"].tolist() == [False, False, True]


class FakeGroup:
    """A process group of ``world`` ranks seen from a non-source rank.

    ``broadcast`` overwrites the tensor in place with the source rank's next mask, as
    ``torch.distributed.broadcast`` does on a receiving rank.
    """

    def __init__(self, world: int, sources: list[Tensor]) -> None:
        self.world = world
        self.sources = list(sources)
        self.calls: list[tuple[torch.dtype, int]] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return self.world

    def broadcast(self, tensor: Tensor, *, src: int) -> None:
        assert isinstance(tensor, Tensor) and isinstance(src, int)
        self.calls.append((tensor.dtype, src))
        tensor.copy_(self.sources.pop(0))


@pytest.mark.parametrize("source", [None, 0, 1])
def test_broadcast_in_a_group_of_two_takes_the_source_ranks_masks(monkeypatch, source):
    sources = [_bool([0, 1]), _bool([1, 1, 0])]
    group = FakeGroup(world=2, sources=sources)
    monkeypatch.setattr(
        masks_module,
        "dist",
        SimpleNamespace(
            **{
                name: getattr(group, name)
                for name in ("is_available", "is_initialized", "get_world_size", "broadcast")
            }
        ),
    )
    masks = Masks({"a": _bool([1, 0]), "b": _bool([0, 0, 1])})
    masks.broadcast() if source is None else masks.broadcast(source=source)
    assert [src for _, src in group.calls] == [source or 0] * 2
    assert masks["a"].dtype == torch.bool and masks["b"].dtype == torch.bool
    assert masks["a"].tolist() == [False, True] and masks["b"].tolist() == [True, True, False]


def test_broadcast_in_a_group_of_one_sends_nothing(monkeypatch):
    group = FakeGroup(world=1, sources=[])
    monkeypatch.setattr(
        masks_module,
        "dist",
        SimpleNamespace(
            **{
                name: getattr(group, name)
                for name in ("is_available", "is_initialized", "get_world_size", "broadcast")
            }
        ),
    )
    masks = Masks({"a": _bool([1, 0])})
    masks.broadcast()
    assert group.calls == [] and masks["a"].tolist() == [True, False]


def test_sparsity_must_leave_something_to_keep():
    assert check_sparsity(0.0) == 0.0 and check_sparsity(0.999) == 0.999
    for bad, note in ((1.0, " (1 would prune every weight)"), (1.5, ""), (-0.1, "")):
        message = re.escape(f"sparsity must be in [0, 1), got {bad}{note}")
        with pytest.raises(ValueError, match=f"^{message}$"):
            check_sparsity(bad)
    weights = {"w": _distinct(4, 4)}
    for build in (global_magnitude_masks, uniform_magnitude_masks):
        with pytest.raises(ValueError, match=r"^sparsity must be in \[0, 1\), got 1\.0 \(1 would"):
            build(weights, 1.0)
        assert build(weights, 0.0).sparsity() == 0.0
