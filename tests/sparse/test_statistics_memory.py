"""SparseGPT's summed statistic: added in place a slab of rows at a time (no second [in, in]
matrix), with the bits of the per-batch products summed as before."""

from __future__ import annotations

import pytest
import torch

from convergent.sparse.sparsegpt import HESSIAN_ROWS, add_hessian_upper, sparsegpt_prune


def batches(tokens: int, width: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, width, generator=generator) for _ in range(count)]


@pytest.mark.parametrize(
    "tokens, width", [(48, 16), (768, 128), (512, 300), (7, 2 * HESSIAN_ROWS + 1)]
)
def test_the_upper_triangle_has_the_bits_of_the_summed_batch_products(tokens, width):
    inputs = batches(tokens, width, 4)
    expected = None  # as the driver summed before: each batch's X^T X, then added
    for x in inputs:
        product = x.double().T @ x.double()
        expected = product if expected is None else expected + product
    total = None
    for x in inputs:
        before = total
        total = add_hessian_upper(x, torch.float64, total)
        if before is not None:
            assert total is before  # in place
    assert torch.equal(torch.triu(total), torch.triu(expected))


def test_sparsegpt_reads_only_the_upper_triangle():
    (x,) = batches(256, 24, 1)
    full = x.double().T @ x.double()
    weight = torch.randn(10, 24, generator=torch.Generator().manual_seed(1))
    upper = torch.triu(full)
    upper[5, 2] = 1e6  # below the diagonal: never read
    for pattern in ("unstructured", "2:4"):
        expected = sparsegpt_prune(weight, full, 0.5, pattern, block_size=8)
        got = sparsegpt_prune(weight, upper, 0.5, pattern, block_size=8)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_the_later_columns_update_in_row_slabs_has_the_whole_products_bits(monkeypatch):
    """The update ``W[:, later] -= Err @ U[block, later]`` runs UPDATE_ROWS rows at a time;
    each entry is the same dot product, so the weights equal one whole product's."""
    from convergent.sparse import sparsegpt

    (x,) = batches(900, 256, 1)
    hessian = x.double().T @ x.double()
    weight = torch.randn(600, 256, generator=torch.Generator().manual_seed(2))
    sliced = sparsegpt_prune(weight, hessian, 0.6, None, block_size=64)
    monkeypatch.setattr(sparsegpt, "UPDATE_ROWS", 10**9)  # one [out, later] product
    whole = sparsegpt_prune(weight, hessian, 0.6, None, block_size=64)
    assert sparsegpt.UPDATE_ROWS == 10**9
    assert torch.equal(sliced[0], whole[0]) and torch.equal(sliced[1], whole[1])
