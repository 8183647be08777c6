"""Known answer: our magnitude masks equal torch.nn.utils.prune's on the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from convergent.sparse import (
    global_magnitude_masks,
    keep_largest,
    magnitude_threshold,
    magnitude_threshold_reference,
    uniform_magnitude_masks,
)


def _layers(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)  # random weights: no ties, so the masks are unique
    return nn.Sequential(nn.Linear(37, 64), nn.Linear(64, 48), nn.Linear(48, 11))


@pytest.mark.parametrize("amount", [0.0, 0.1, 0.5, 0.731, 0.9, 0.99])
def test_global_masks_equal_prune_global_unstructured(amount):
    ours_model, theirs_model = _layers(0), _layers(0)
    tensors = {f"{i}.weight": layer.weight for i, layer in enumerate(ours_model)}
    ours = global_magnitude_masks(tensors, amount)
    prune.global_unstructured(
        [(layer, "weight") for layer in theirs_model],
        pruning_method=prune.L1Unstructured,
        amount=amount,
    )
    total = sum(t.numel() for t in tensors.values())
    assert total - ours.kept == round(amount * total)  # exact top-k
    for index, layer in enumerate(theirs_model):
        assert torch.equal(ours[f"{index}.weight"], layer.weight_mask.bool())


@pytest.mark.parametrize("amount", [0.25, 0.8])
def test_uniform_masks_equal_prune_l1_unstructured_per_layer(amount):
    ours_model, theirs_model = _layers(1), _layers(1)
    ours = uniform_magnitude_masks(
        {f"{i}.weight": layer.weight for i, layer in enumerate(ours_model)}, amount
    )
    for index, layer in enumerate(theirs_model):
        prune.l1_unstructured(layer, "weight", amount=amount)
        assert torch.equal(ours[f"{index}.weight"], layer.weight_mask.bool())
        assert int((~ours[f"{index}.weight"]).sum()) == round(amount * layer.weight.numel())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_radix_threshold_equals_kthvalue(dtype):
    generator = torch.Generator().manual_seed(3)
    tensors = [
        (torch.randn(50, 40, generator=generator) * scale).to(dtype) for scale in (1e-3, 1.0, 30.0)
    ]
    tensors.append(torch.zeros(17, 3, dtype=dtype))  # exact zeros and ties
    total = sum(t.numel() for t in tensors)
    for k in (1, 2, 51, total // 3, total // 2, total - 1, total):
        fast = magnitude_threshold(tensors, k)
        reference = magnitude_threshold_reference(tensors, k)
        assert torch.equal(fast.value, reference.value), k
        assert (fast.below, fast.equal) == (reference.below, reference.equal), k


def test_exact_count_with_heavy_ties():
    # Integer weights: many magnitudes tie at the threshold; exactly k are still pruned.
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randint(-3, 4, (31, 7), generator=generator).float() for _ in range(3)]
    total = sum(t.numel() for t in tensors)
    for k in range(0, total + 1, 41):
        masks = keep_largest(tensors, k)
        assert sum(int((~mask).sum()) for mask in masks) == k
        kept = torch.cat([t[m].abs() for t, m in zip(tensors, masks, strict=True)])
        pruned = torch.cat([t[~m].abs() for t, m in zip(tensors, masks, strict=True)])
        if k and k < total:
            assert pruned.max() <= kept.min()  # magnitude order is respected


def test_sparsity_out_of_range_names_the_value():
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\), got 1.5"):
        global_magnitude_masks({"w": torch.randn(3, 3)}, 1.5)
    # 1 would prune every weight (torch.nn.utils.prune allows it; our masks refuse it).
    with pytest.raises(ValueError, match=r"got 1.0 \(1 would prune every weight\)"):
        global_magnitude_masks({"w": torch.randn(3, 3)}, 1.0)


def test_one_pass_masks_equal_the_threshold_route_and_survive_a_missed_bracket(monkeypatch):
    from convergent.sparse import topk

    generator = torch.Generator().manual_seed(5)
    tensors = [torch.randn(300, 70, generator=generator), torch.randn(999, generator=generator)]
    total = sum(t.numel() for t in tensors)
    for k in (1, 100, total // 2, total - 3, total):
        fast = keep_largest(tensors, k)
        slow = keep_largest(tensors, k, magnitude_threshold(tensors, k))
        assert all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True)), k
    # A sample that misses the k-th magnitude must not change the answer.
    monkeypatch.setattr(topk, "_sample_bracket", lambda *args: (0, 1))
    missed = keep_largest(tensors, total // 2)
    expected = keep_largest(tensors, total // 2, magnitude_threshold(tensors, total // 2))
    assert all(torch.equal(a, b) for a, b in zip(missed, expected, strict=True))
    assert sum(int((~mask).sum()) for mask in missed) == total // 2
