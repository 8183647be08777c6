"""The calibration statistics' dtype: float64 by default in the library (the studies' units
were computed with it), float32 on request, and the SparseGPT factorization in that dtype."""

from __future__ import annotations

import pytest
import torch

from convergent.sparse import prune_one_shot
from convergent.sparse.pruners import make_pruner
from convergent.sparse.sparsegpt import sparsegpt_prune
from tests.sparse.test_blockwise import calibration, ours


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_the_statistics_are_gathered_in_the_dtype_asked_for(method):
    inputs = torch.randn(3, 5, 8, dtype=torch.float32)
    assert make_pruner(method).statistic(inputs).dtype == torch.float64  # the default
    for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
        statistic = make_pruner(method, {"statistics": name}).statistic(inputs)
        assert statistic.dtype == dtype
        rows = inputs.reshape(-1, 8).to(dtype)
        expected = rows.T @ rows if method == "sparsegpt" else rows.square().sum(0)
        if method == "sparsegpt":  # it sums the upper triangle, the half SparseGPT reads
            statistic, expected = torch.triu(statistic), torch.triu(expected)
        torch.testing.assert_close(statistic, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"statistics must be one of float32, float64, got"):
        make_pruner(method, {"statistics": "float16"})


def test_sparsegpt_factorizes_in_the_statistics_dtype(monkeypatch):
    import convergent.sparse.sparsegpt as module

    seen = []
    cholesky = torch.linalg.cholesky_ex

    def recording(matrix, *args, **kwargs):
        seen.append(matrix.dtype)
        return cholesky(matrix, *args, **kwargs)

    monkeypatch.setattr(module.torch.linalg, "cholesky_ex", recording)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=generator)
    weight = torch.randn(8, 16, generator=generator)
    new32, keep32 = sparsegpt_prune(weight, (x.T @ x), 0.5, block_size=8,
                                    statistics_dtype=torch.float32)  # fmt: skip
    assert set(seen) == {torch.float32}
    seen.clear()
    new64, keep64 = sparsegpt_prune(weight, (x.T @ x).double(), 0.5, block_size=8)
    assert set(seen) == {torch.float64}
    # a well-conditioned problem: the same mask, the same weights to float32's precision
    assert torch.equal(keep32, keep64)
    torch.testing.assert_close(new32, new64, rtol=1e-4, atol=1e-5)


def test_the_report_names_the_statistics_and_the_default_is_float64():
    report = prune_one_shot(ours(), 0.5, method="sparsegpt", calibration=calibration())
    assert report.options["statistics"] == "float64"
    report = prune_one_shot(ours(), 0.5, method="sparsegpt", calibration=calibration(),
                            options={"statistics": "float32"})  # fmt: skip
    assert report.options["statistics"] == "float32"
