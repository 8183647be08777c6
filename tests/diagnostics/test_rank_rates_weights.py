from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from convergent.diagnostics import (
    fit_linear_rate,
    layerwise_rank_collapse,
    query_key_norms,
    rank_collapse,
    weight_statistics,
)
from convergent.models import Transformer, TransformerConfig


def test_rank_collapse_known_values():
    # Every token the same vector: exactly rank one, residual 0.
    same = torch.tensor([1.0, 2.0, 3.0]).expand(1, 4, 3)
    assert rank_collapse(same).item() == pytest.approx(0.0, abs=1e-7)
    # Two tokens +v and -v: the mean is 0, so the whole matrix is residual.
    opposite = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    assert rank_collapse(opposite).item() == pytest.approx(1.0)
    # [[1, 0], [0, 1]]: mean (0.5, 0.5), residual norm 1, total norm sqrt(2).
    identity = torch.eye(2)[None]
    assert rank_collapse(identity).item() == pytest.approx(1 / math.sqrt(2))
    # Padding rows are ignored, whatever they hold.
    padded = torch.cat([same, torch.randn(1, 2, 3)], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    assert rank_collapse(padded, mask).item() == pytest.approx(0.0, abs=1e-7)
    assert rank_collapse(padded).item() > 0.1


def test_layerwise_rank_collapse_has_one_row_per_hidden_state():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(input_dim=4, max_len=6, n_layers=3, d_model=8, n_heads=2))
    values = layerwise_rank_collapse(model, {"inputs": torch.randn(5, 6, 4), "labels": None})
    assert values.shape == (4, 5)
    assert ((values >= 0) & (values <= 1)).all()


@pytest.mark.parametrize("rate", [0.5, 0.9, 0.99])
def test_rate_fit_recovers_an_exact_geometric_sequence(rate):
    losses = 3.0 * rate ** np.arange(50)
    fit = fit_linear_rate(losses)
    assert fit.rate == pytest.approx(rate, rel=1e-9)
    assert fit.rate_low == pytest.approx(rate, rel=1e-6)
    assert fit.rate_high == pytest.approx(rate, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.contraction == pytest.approx(1 - rate)
    assert fit.steps_to_halve == pytest.approx(math.log(0.5) / math.log(rate))


def test_rate_fit_interval_covers_the_true_rate_under_noise():
    generator = np.random.default_rng(0)
    trials, covered = 4000, 0
    for _ in range(trials):
        noise = np.exp(generator.normal(0.0, 0.1, size=40))
        fit = fit_linear_rate(2.0 * 0.95 ** np.arange(40) * noise, confidence=0.9)
        covered += fit.rate_low <= 0.95 <= fit.rate_high
    # A 90 % interval covers 3600 of 4000 times, binomial sd 19: the band is +-4.5 sd, so an
    # 85 % (3400) or a 95 % (3800) interval fails it.
    assert 3515 <= covered <= 3685


def test_rate_fit_window_steps_and_floor():
    steps = np.arange(0, 200, 5)
    losses = 0.1 + 0.97**steps
    fit = fit_linear_rate(losses, start=2, stop=30, steps=steps, floor=0.1)
    assert fit.rate == pytest.approx(0.97, rel=1e-9)
    assert (fit.start, fit.stop, fit.points) == (2, 30, 28)
    without_floor = fit_linear_rate(losses, steps=steps)
    assert without_floor.rate > 0.98  # the floor flattens the curve: the fit sees it


def test_rate_fit_rejects_bad_input():
    with pytest.raises(ValueError, match=r"window \[5, 3\) is out of range"):
        fit_linear_rate([1.0] * 10, start=5, stop=3)
    with pytest.raises(ValueError, match="at least 3 are needed"):
        fit_linear_rate([1.0, 0.5, 0.0, -1.0])
    with pytest.raises(ValueError, match=r"confidence=1.5 is out of range"):
        fit_linear_rate([1.0, 0.5, 0.25], confidence=1.5)


def test_weight_statistics_and_query_key_norms():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(input_dim=4, max_len=6, n_layers=2, d_model=8, n_heads=2))
    with torch.no_grad():
        model.blocks[0].attention.q_proj.weight[:4] = 0.0
    rows = {row["name"]: row for row in weight_statistics(model)}
    assert rows["blocks.0.attention.q_proj.weight"]["sparsity"] == pytest.approx(0.5)
    assert rows["blocks.1.attention.q_proj.weight"]["sparsity"] == 0.0
    assert "blocks.0.attention.q_proj.bias" not in rows
    norms = query_key_norms(model)
    assert [row["layer"] for row in norms] == ["blocks.0.attention", "blocks.1.attention"]
    w_q = model.blocks[1].attention.q_proj.weight.detach()
    w_k = model.blocks[1].attention.k_proj.weight.detach()
    assert norms[1]["query_frobenius"] == pytest.approx(float(w_q.norm()))
    expected = float(torch.linalg.svdvals(w_q.T @ w_k)[0])
    assert norms[1]["query_key_spectral"] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="no query/key projections"):
        query_key_norms(torch.nn.Linear(2, 2))
