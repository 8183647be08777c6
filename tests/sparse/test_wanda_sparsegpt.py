"""Wanda and SparseGPT on one layer, against references written out in this file."""

from __future__ import annotations

import pytest
import torch

from convergent.sparse.sparsegpt import hessian, sparsegpt_prune
from convergent.sparse.wanda import (
    input_squared_norms,
    norms_from_squares,
    wanda_mask,
    wanda_scores,
)


def _layer(out: int = 6, inputs: int = 16, tokens: int = 64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inputs, generator=generator, dtype=torch.float64)
    # Input features on different scales, so that the norms change the ranking.
    scales = torch.logspace(-1, 1, inputs, dtype=torch.float64)
    x = torch.randn(tokens, inputs, generator=generator, dtype=torch.float64) * scales
    return weight, x


def _top_k_per_row(scores: torch.Tensor, keep: int) -> torch.Tensor:
    mask = torch.zeros_like(scores, dtype=torch.bool)
    return mask.scatter_(1, scores.topk(keep, dim=1).indices, True)


def _groups(mask: torch.Tensor, m: int) -> torch.Tensor:
    return mask.reshape(mask.shape[0], -1, m).sum(dim=-1)


# ---- statistics ------------------------------------------------------------------------------


def test_statistics_add_up_over_batches():
    _, x = _layer(tokens=64)
    squares = input_squared_norms(x[:40]) + input_squared_norms(x[40:].reshape(2, 12, -1))
    assert squares.dtype == torch.float64
    torch.testing.assert_close(norms_from_squares(squares), torch.linalg.norm(x, dim=0))
    h = hessian(x[:40]) + hessian(x[40:].reshape(2, 12, -1))
    torch.testing.assert_close(h, torch.einsum("ti,tj->ij", x, x))


# ---- Wanda -----------------------------------------------------------------------------------


def test_wanda_keeps_the_top_half_of_each_row_by_weight_times_input_norm():
    weight, x = _layer(out=8, inputs=32, tokens=50)
    scores = weight.abs() * torch.linalg.norm(x, dim=0)
    torch.testing.assert_close(wanda_scores(weight, input_squared_norms(x)), scores)
    mask = wanda_mask(weight, input_squared_norms(x), 0.5, "unstructured")
    assert torch.equal(mask, _top_k_per_row(scores, 16))
    assert torch.equal(mask.sum(dim=1), torch.full((8,), 16))


def test_wanda_prunes_round_sparsity_times_inputs_per_row():
    weight, x = _layer(out=5, inputs=16)
    mask = wanda_mask(
        weight, input_squared_norms(x), 0.3, "unstructured"
    )  # round(4.8) = 5 pruned per row
    scores = weight.abs() * torch.linalg.norm(x, dim=0)
    assert torch.equal(mask, _top_k_per_row(scores, 11))


def test_wanda_n_m_keeps_the_n_best_of_every_m_inputs():
    weight, x = _layer(out=6, inputs=32)
    scores = weight.abs() * torch.linalg.norm(x, dim=0)
    for n, m in ((2, 4), (4, 8), (1, 4), (3, 8)):
        mask = wanda_mask(weight, input_squared_norms(x), 0.5, f"{n}:{m}")
        assert torch.equal(_groups(mask, m), torch.full((6, 32 // m), n))
        grouped = scores.reshape(6, -1, m)
        expected = torch.zeros_like(grouped, dtype=torch.bool)
        expected.scatter_(-1, grouped.topk(n, dim=-1).indices, True)
        assert torch.equal(mask, expected.reshape(6, 32))


def test_wanda_breaks_ties_by_pruning_the_earlier_inputs():
    weight = torch.ones(3, 8)
    mask = wanda_mask(weight, torch.ones(8), 0.5, "unstructured")
    assert torch.equal(mask, torch.tensor([[False] * 4 + [True] * 4] * 3))
    mask = wanda_mask(weight, torch.ones(8), 0.5, "2:4")
    assert torch.equal(mask, torch.tensor([[False, False, True, True] * 2] * 3))


# ---- SparseGPT -------------------------------------------------------------------------------


def _saliency_denominator(h: torch.Tensor, column: int) -> torch.Tensor:
    """[ (H restricted to the columns column..in-1)^-1 ]_00, by a direct inverse."""
    return torch.linalg.inv(h[column:, column:])[0, 0]


def _keep_lowest_pruned(scores: torch.Tensor, prune: int) -> torch.Tensor:
    keep = torch.ones_like(scores, dtype=torch.bool)
    return keep.scatter_(1, scores.topk(prune, dim=1, largest=False).indices, False)


def _sequential_obs(weight, h, sparsity, pattern, block_size, damping):
    """Column-by-column optimal brain surgeon with an explicitly maintained inverse Hessian.

    The inverse of H over the columns not yet processed is updated by the Schur-complement
    downdate when a column is frozen; no Cholesky factor is involved.
    """
    w, h = weight.clone(), h.clone()
    inputs = w.shape[1]
    for j in range(inputs):
        if h[j, j] == 0:
            h[j, j] = 1.0
            w[:, j] = 0.0
    h = h + damping * torch.diagonal(h).mean() * torch.eye(inputs, dtype=h.dtype)
    inverse = torch.linalg.inv(h)  # over the remaining columns j..in-1
    mask = torch.ones_like(w, dtype=torch.bool)
    nm = None if pattern == "unstructured" else tuple(int(p) for p in pattern.split(":"))
    for j in range(inputs):
        width = block_size if nm is None else nm[1]  # the mask is chosen width columns at a time
        if j % width == 0:
            cols = range(j, min(j + width, inputs))
            denominators = torch.stack([_saliency_denominator(h, c) for c in cols])
            scores = w[:, j : j + len(cols)] ** 2 / denominators
            prune = round(sparsity * len(cols)) if nm is None else nm[1] - nm[0]
            mask[:, j : j + len(cols)] = _keep_lowest_pruned(scores, prune)
        target = torch.where(mask[:, j], w[:, j], torch.zeros(()))
        delta = (w[:, j] - target) / inverse[0, 0]
        w[:, j:] -= delta[:, None] * inverse[0, :][None, :]
        w[:, j] = target
        inverse = inverse[1:, 1:] - torch.outer(inverse[1:, 0], inverse[0, 1:]) / inverse[0, 0]
    return w, mask


@pytest.mark.parametrize(
    ("pattern", "block_size"),
    [("unstructured", 16), ("unstructured", 128), ("unstructured", 8), ("2:4", 16), ("2:4", 8)],
)
def test_sparsegpt_equals_sequential_optimal_brain_surgeon(pattern, block_size):
    weight, x = _layer(out=6, inputs=16, tokens=64)
    x[:, 5] = 0.0  # an input never seen: its column must end at zero
    h = hessian(x)
    new, mask = sparsegpt_prune(weight, h, 0.5, pattern, block_size=block_size, damping=0.01)
    expected, expected_mask = _sequential_obs(weight, h, 0.5, pattern, block_size, 0.01)
    assert torch.equal(mask, expected_mask)
    torch.testing.assert_close(new, expected, rtol=0, atol=1e-10)
    assert bool((new[~mask] == 0).all())
    assert bool((new[:, 5] == 0).all())
    assert torch.equal(mask.sum(dim=1), torch.full((6,), 8))


def test_sparsegpt_returns_the_input_dtype_and_keeps_dense_at_zero_sparsity():
    weight, x = _layer(out=4, inputs=16)
    new, mask = sparsegpt_prune(weight.float(), hessian(x), 0.0, "unstructured")
    assert new.dtype == torch.float32
    assert bool(mask.all())
    torch.testing.assert_close(new, weight.float())


def test_sparsegpt_reconstructs_correlated_inputs_better_than_magnitude():
    generator = torch.Generator().manual_seed(1)
    inputs, tokens, rank = 64, 512, 6
    z = torch.randn(tokens, rank, generator=generator, dtype=torch.float64)
    mixing = torch.randn(rank, inputs, generator=generator, dtype=torch.float64)
    x = z @ mixing + 0.05 * torch.randn(tokens, inputs, generator=generator, dtype=torch.float64)
    weight = torch.randn(32, inputs, generator=generator, dtype=torch.float64)
    magnitude = weight * _top_k_per_row(weight.abs(), inputs // 2)
    pruned, _ = sparsegpt_prune(weight, hessian(x), 0.5, "unstructured")

    def error(w):
        return torch.linalg.norm(weight @ x.T - w @ x.T)

    # Measured: SparseGPT's error is 9.9x smaller than magnitude pruning's here (62.3 against
    # 614.5); seeds 1-5 of this construction gave 4.5x-14x, so the bar of 3x is not luck.
    assert error(pruned) < error(magnitude) / 3


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "3:8"])
def test_n_m_holds_in_every_group_for_both_methods(pattern):
    n, m = (int(p) for p in pattern.split(":"))
    weight, x = _layer(out=6, inputs=32)
    wanda = wanda_mask(weight, input_squared_norms(x), 0.5, pattern)
    new, mask = sparsegpt_prune(weight, hessian(x), 0.5, pattern, block_size=16)
    for keep in (wanda, mask, new != 0):
        assert torch.equal(_groups(keep, m), torch.full((6, 32 // m), n))


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sparsity": 1.0}, r"sparsity must be in \[0, 1\), got 1.0"),
        ({"sparsity": -0.1}, r"sparsity must be in \[0, 1\), got -0.1"),
        ({"pattern": "2-4"}, r"'N:M' with 1 <= N <= M, got '2-4'"),
        ({"pattern": "0:4"}, r"'N:M' with 1 <= N <= M, got '0:4'"),
        ({"pattern": "5:4"}, r"'N:M' with 1 <= N <= M, got '5:4'"),
        ({"pattern": "2:3"}, r"multiple of M = 3, got 16"),
    ],
)
def test_bad_arguments_are_one_sentence(kwargs, message):
    weight, x = _layer(out=4, inputs=16)
    arguments = {"sparsity": 0.5, "pattern": "unstructured", **kwargs}
    with pytest.raises(ValueError, match=message):
        wanda_mask(weight, input_squared_norms(x), **arguments)
    with pytest.raises(ValueError, match=message):
        sparsegpt_prune(weight, hessian(x), **arguments)


def test_shape_mismatches_and_bad_settings_are_one_sentence():
    weight, x = _layer(out=4, inputs=16)
    with pytest.raises(ValueError, match=r"hessian must have shape \(16, 16\).*got \(15, 15\)"):
        sparsegpt_prune(weight, hessian(x[:, :15]), 0.5, "unstructured")
    with pytest.raises(ValueError, match=r"squared_norms must have shape \(16,\).*got \(15,\)"):
        wanda_mask(weight, input_squared_norms(x[:, :15]), 0.5, "unstructured")
    with pytest.raises(ValueError, match=r"block_size must be a multiple of M = 4.*got 6"):
        sparsegpt_prune(weight, hessian(x), 0.5, "2:4", block_size=6)
    with pytest.raises(ValueError, match=r"damping must be a finite number >= 0, got -1"):
        sparsegpt_prune(weight, hessian(x), 0.5, "unstructured", damping=-1)
