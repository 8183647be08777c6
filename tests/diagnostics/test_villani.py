"""Villani's quantity: Hutchinson's Laplacian, rays with and without a penalty, model potentials."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from convergent.diagnostics import flat_potential, villani_along_ray, villani_quantity
from convergent.losses import task_loss
from convergent.models import Transformer, TransformerConfig
from convergent.regularize import VillaniRegularizer, log_amplified_penalty, select_parameters


def _transformer(n_layers: int = 2) -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(task="regression", input_dim=4, num_outputs=3, pooling="mean",
                               d_model=8, n_heads=1, n_layers=n_layers, max_len=5)  # fmt: skip
    return Transformer(config)


def test_hutchinson_is_exact_for_a_diagonal_quadratic():
    scales = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    point = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    result = villani_quantity(lambda x: 0.5 * (scales * x * x).sum(), point, s=2.0, probes=3)
    assert result["laplacian"] == pytest.approx(6.0)
    assert result["gradient_norm_squared"] == pytest.approx(1 + 4 + 36)
    assert result["villani"] == pytest.approx(41 / 2 - 6)
    with pytest.raises(ValueError, match="s must be a finite number > 0, got 0"):
        villani_quantity(lambda x: x.sum(), point, s=0)


def _logistic(lam: float):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(64, 10, generator=generator, dtype=torch.float64)
    signs = torch.randn(64, generator=generator, dtype=torch.float64).sign()
    return lambda x: (
        torch.nn.functional.softplus(-signs * (features @ x)).mean() + log_amplified_penalty(x, lam)
    )


@pytest.mark.parametrize("lam", [0.0, 0.01])
def test_villani_grows_along_a_ray_only_with_the_regularizer(lam):
    direction = torch.randn(10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rows = villani_along_ray(_logistic(lam), direction, [4.0, 8.0, 16.0, 32.0], s=0.1, probes=4,
                             generator=torch.Generator().manual_seed(2))  # fmt: skip
    values = [row["villani"] for row in rows]
    if lam > 0:
        assert all(b > 2 * a for a, b in itertools.pairwise(values[1:]))
        assert values[-1] > 100
    else:  # the logistic loss is Lipschitz: ||grad||^2 stays bounded and the Laplacian fades
        assert values[-1] < 5 and values[-1] - values[-2] < 0.5


def test_flat_potential_over_model_parameters():
    model = _transformer()
    targets = select_parameters(model, "query_key")
    regularizer = VillaniRegularizer(model, "query_key", lam=0.1)
    inputs, labels = torch.randn(4, 5, 4), torch.randn(4, 3)

    def objective(values):
        logits = torch.func.functional_call(model, values, kwargs={"inputs": inputs}).logits
        return task_loss(logits, labels, "regression") + regularizer(values)

    potential = flat_potential(objective, {n: p.shape for n, p in targets.items()})
    point = torch.cat([p.detach().flatten() for p in targets.values()])
    direct = task_loss(model(inputs=inputs).logits, labels, "regression") + regularizer()
    assert float(potential(point).detach()) == pytest.approx(float(direct.detach()), rel=1e-6)
    assert float(potential(2 * point).detach()) > float(potential(point).detach())
    result = villani_quantity(potential, point, s=0.01, probes=2)
    assert math.isfinite(result["villani"])
