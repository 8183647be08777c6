"""SparseGPT's factor computed in the Hessian's own memory has the bits of torch's sequence."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from convergent.sparse import inverse_factor, prune_one_shot, sparsegpt
from convergent.sparse.calibration import Statistics
from convergent.sparse.sparsegpt import _inverse_cholesky_factor, add_hessian_upper

pytestmark = pytest.mark.skipif(
    inverse_factor.lapack(torch.zeros(2, 2, dtype=torch.float64)) is None,
    reason="this torch exports no LAPACK symbols",
)


def torch_factor(upper: torch.Tensor, damped_diagonal: torch.Tensor) -> torch.Tensor:
    """SparseGPT's factor as torch computes it: cholesky, cholesky_inverse, cholesky upper."""
    n = upper.shape[0]
    matrix = upper.triu() + upper.triu(1).T
    matrix.diagonal().copy_(damped_diagonal)
    factor = torch.empty_strided((n, n), (1, n), dtype=upper.dtype).copy_(matrix)
    info = torch.zeros((), dtype=torch.int32)
    torch.linalg.cholesky_ex(factor, out=(factor, info))
    assert int(info) == 0
    torch.cholesky_inverse(factor, out=factor)
    torch.linalg.cholesky_ex(factor, upper=True, out=(factor, info))
    assert int(info) == 0
    return factor


def summed_upper(width: int, tokens: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(width)
    inputs = torch.randn(tokens, width, generator=generator) * torch.rand(
        width, generator=generator
    )
    return add_hessian_upper(inputs, dtype)  # its lower triangle as the sum leaves it


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("width", "tokens"), [(37, 90), (300, 400)])  # 300: not a slab multiple
def test_the_factor_in_place_has_torchs_bits(dtype, width, tokens):
    upper = summed_upper(width, tokens, dtype)
    diagonal = upper.diagonal().clone()
    damped = diagonal + 0.01 * diagonal.mean()
    expected = torch_factor(upper.clone(), damped)

    weight = torch.ones(3, width, dtype=torch.float32)
    factor = _inverse_cholesky_factor(upper, weight, 0.01, dtype, overwrite=True)

    assert factor.data_ptr() == upper.data_ptr()  # no second matrix
    assert torch.equal(factor.triu(), expected.triu())


def test_a_failed_damping_is_retried_from_the_hessian_kept_in_the_other_triangle(caplog):
    width = 64
    generator = torch.Generator().manual_seed(3)
    basis, _ = torch.linalg.qr(torch.randn(width, width, generator=generator, dtype=torch.float64))
    eigenvalues = torch.linspace(1.0, 2.0, width, dtype=torch.float64)
    eigenvalues[0] = -0.05 * float(eigenvalues.mean())
    symmetric = basis @ torch.diag(eigenvalues) @ basis.T
    symmetric = (symmetric + symmetric.T) / 2
    upper = symmetric.triu() + torch.randn(width, width, generator=generator).tril(-1).double()
    mean = symmetric.diagonal().mean()
    # 0.01 x mean leaves the smallest eigenvalue near -0.04 x mean; 0.1 x mean makes it positive
    expected = torch_factor(symmetric.clone(), symmetric.diagonal() + 0.1 * mean)

    weight = torch.ones(2, width, dtype=torch.float32)
    with caplog.at_level("WARNING", logger="convergent.sparse.sparsegpt"):
        factor = _inverse_cholesky_factor(upper, weight, 0.01, torch.float64, overwrite=True)

    assert [r.getMessage() for r in caplog.records] == [
        "SparseGPT: the Hessian damped at 0.01 is not positive definite; retrying at damping 0.1"
    ]
    assert torch.equal(factor.triu(), expected.triu())


def test_the_hessian_is_kept_when_not_overwritten():
    upper = summed_upper(50, 80, torch.float64)
    before = upper.clone()
    _inverse_cholesky_factor(upper, torch.ones(2, 50), 0.01, torch.float64, overwrite=False)
    assert torch.equal(upper, before)


def test_swapping_triangles_is_a_transpose():
    matrix = torch.randn(300, 300, dtype=torch.float64)
    expected = matrix.T.clone()
    inverse_factor.swap_triangles(matrix)
    assert torch.equal(matrix, expected)


def test_the_driver_factors_in_place_only_for_a_statistics_last_reader(monkeypatch):
    """q, k and v share one Hessian: only v (the last) may consume it (and its weight); o,
    gate/up's last reader and down consume theirs. The pruned model has the bits of the copying
    path."""

    def pruned(in_place: bool) -> tuple[dict[str, torch.Tensor], list[bool]]:
        seen: list[bool] = []
        real = sparsegpt.sparsegpt_prune

        def spy(*args, **kwargs):
            seen.append(kwargs.get("overwrite_hessian", False))
            return real(*args, **kwargs)

        monkeypatch.setattr(sparsegpt, "sparsegpt_prune", spy)
        if not in_place:  # nothing consumed: the Hessians copied, the weights copied
            monkeypatch.setattr(Statistics, "last_reader", lambda self, name: False)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=176,
                             num_hidden_layers=2, num_attention_heads=4)  # fmt: skip
        model = LlamaForCausalLM(config)
        generator = torch.Generator().manual_seed(1)
        batches = [{"input_ids": torch.randint(0, 97, (4, 40), generator=generator)}] * 3
        prune_one_shot(model, 0.6, method="sparsegpt", calibration=batches)
        monkeypatch.undo()
        return model.state_dict(), seen

    in_place, consumed = pruned(True)
    copied, _ = pruned(False)

    # per block: q, k, v (v last), o, gate, up (up last), down
    assert consumed == [False, False, True, True, False, True, True] * 2
    assert all(torch.equal(in_place[name], copied[name]) for name in copied)


def test_last_reader_follows_the_shared_input():
    shared = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    alone = torch.nn.Linear(4, 4)
    layers = {"q": shared[0], "k": shared[1], "o": alone}
    statistics = Statistics(
        layers, lambda x, total=None: x.sum(0) + (0 if total is None else total)
    )
    x = torch.randn(2, 4)
    shared[0](x), shared[1](x), alone(torch.randn(2, 4))
    statistics.close()
    assert not statistics.last_reader("q") and statistics.last_reader("o")
    statistics.release("q")
    assert statistics.last_reader("k")


def test_a_consumed_weight_is_updated_in_its_own_memory():
    upper = summed_upper(64, 200, torch.float64)
    weight = torch.randn(12, 64, generator=torch.Generator().manual_seed(5))
    expected, expected_mask = sparsegpt.sparsegpt_prune(weight, upper.clone(), 0.5)
    kept = weight.clone()
    new, mask = sparsegpt.sparsegpt_prune(weight, upper, 0.5, overwrite_hessian=True)
    assert new.data_ptr() == weight.data_ptr() and not torch.equal(weight, kept)
    assert torch.equal(new, expected) and torch.equal(mask, expected_mask)
