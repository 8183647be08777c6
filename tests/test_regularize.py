from __future__ import annotations

import math

import pytest
import torch
from transformers import BertConfig, BertModel

from convergent.models import HFEncoder
from convergent.models.lora import add_query_key_lora
from convergent.regularize import (
    VillaniRegularizer,
    lam_for_stationary_radius,
    log_amplified_penalty,
    penalty,
    select_parameters,
    stationary_radius,
    super_quadratic_penalty,
)
from tests.conftest import tiny_lora_model, tiny_regression_transformer


def _tiny_bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=8)  # fmt: skip
    return BertModel(config, add_pooling_layer=False)


def test_penalties_have_their_formulas():
    weight = torch.randn(3, 4, dtype=torch.float64)
    squared = float(weight.pow(2).sum())
    assert float(log_amplified_penalty(weight, 0.3)) == pytest.approx(
        0.3 * squared * math.log1p(squared)
    )
    norm = math.sqrt(squared)
    assert float(super_quadratic_penalty(weight, 0.3, 0.5)) == pytest.approx(0.3 * norm**2.5)
    assert float(penalty(weight, "power", 0.3, 0.5)) == pytest.approx(0.3 * norm**2.5)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
@pytest.mark.parametrize("kind", ["log", "power"])
def test_penalty_gradients_pass_gradcheck_in_float64(kind, scale):
    weight = (scale * torch.randn(3, 4, dtype=torch.float64)).requires_grad_(True)
    function = lambda w: penalty(w, kind, 0.7, 0.5)  # noqa: E731
    assert torch.autograd.gradcheck(function, (weight,))
    assert torch.autograd.gradgradcheck(function, (weight,))  # the Laplacian needs it


@pytest.mark.parametrize("kind", ["log", "power"])
def test_penalty_is_smooth_at_zero(kind):
    weight = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    (gradient,) = torch.autograd.grad(penalty(weight, kind, 1.0, 0.5), weight)
    assert torch.equal(gradient, torch.zeros_like(gradient))


@pytest.mark.parametrize(
    ("call", "message"),
    [(lambda w: log_amplified_penalty(w, -1.0), "lam must be a finite number >= 0, got -1.0"),
     (lambda w: super_quadratic_penalty(w, 1.0, 0.0), "eps must be a finite number > 0, got 0.0"),
     (lambda w: super_quadratic_penalty(w, 1.0, -2.0), "eps must be a finite number > 0, got -2.0"),
     (lambda w: penalty(w, "cubic", 1.0), "penalty must be one of")],
)  # fmt: skip
def test_bad_penalty_arguments_name_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.ones(2))


def test_query_key_preset_on_our_transformer_and_on_bert():
    ours = select_parameters(tiny_regression_transformer(), "query_key")
    assert list(ours) == [f"blocks.{i}.attention.{p}_proj.weight" for i in (0, 1) for p in "qk"]
    bert = select_parameters(_tiny_bert(), "query_key")
    assert list(bert) == [f"encoder.layer.{i}.attention.self.{p}.weight" for i in (0, 1)
                          for p in ("query", "key")]  # fmt: skip


def test_glob_and_regex_patterns():
    model = tiny_regression_transformer()
    assert list(select_parameters(model, "*.0.attention.q_proj.*", syntax="glob")) == [
        "blocks.0.attention.q_proj.weight", "blocks.0.attention.q_proj.bias"]  # fmt: skip
    assert list(select_parameters(model, [r"k_proj\.bias$"])) == [
        "blocks.0.attention.k_proj.bias", "blocks.1.attention.k_proj.bias"]  # fmt: skip


def test_a_pattern_that_matches_nothing_names_it_and_lists_close_matches():
    with pytest.raises(ValueError, match=r"pattern 'q_prj' \(regex\) matches no parameter of "
                       r"Transformer; close matches: blocks\.0\.attention\.q_proj\.weight"):  # fmt: skip
        select_parameters(tiny_regression_transformer(), ["q_proj", "q_prj"])
    with pytest.raises(
        ValueError, match=r"pattern 'query' .* close matches: .*blocks\.0\.attention\.q_proj"
    ):
        select_parameters(tiny_regression_transformer(), "query")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        select_parameters(tiny_regression_transformer(), "q_proj[")


def test_regularizer_sums_the_penalties_and_reports_norms():
    model = tiny_regression_transformer()
    regularizer = VillaniRegularizer(model, "query_key", penalty="power", lam=0.5, eps=1.0)
    weights = select_parameters(model, "query_key").values()
    expected = sum(0.5 * float(w.detach().norm()) ** 3 for w in weights)
    assert float(regularizer().detach()) == pytest.approx(expected, rel=1e-5)
    assert set(regularizer.norms()) == {
        f"blocks.{i}.attention.{p}_proj.weight" for i in (0, 1) for p in "qk"
    }
    with pytest.raises(ValueError, match=r"lam must be a finite number >= 0, got -0\.1"):
        VillaniRegularizer(model, lam=-0.1)
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got 0"):
        VillaniRegularizer(model, penalty="power", eps=0)


def test_lora_factors_and_products():
    model = tiny_lora_model()
    factors = VillaniRegularizer(model, "lora", lam=1.0)
    assert len(factors.parameters) == 8 and all(".lora_" in name for name in factors.parameters)
    products = VillaniRegularizer(model, penalty="log", lam=1.0, product=True)
    assert len(products.pairs) == 4
    _, a, b = products.pairs[0]
    assert products.weights()[products.pairs[0][0]].shape == (8, 8)
    squared = float((b @ a).detach().pow(2).sum())
    assert float(penalty(b @ a, "log", 1.0).detach()) == pytest.approx(
        squared * math.log1p(squared)
    )
    with pytest.raises(ValueError, match="no LoRA factor"):
        VillaniRegularizer(tiny_regression_transformer(), product=True)


def test_lora_on_bert_targets_query_and_key():
    model = add_query_key_lora(HFEncoder(_tiny_bert(), task="regression", num_outputs=1), rank=2)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    assert len(names) == 8
    assert all(".query.lora_" in name or ".key.lora_" in name for name in names)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_stationary_radius_is_the_mode_of_the_penalty_density(kind):
    numel, s, radius = 64, 0.01, 2.5
    lam = lam_for_stationary_radius(kind, radius, numel, s, eps=1.0)
    assert stationary_radius(kind, lam, numel, s, eps=1.0) == pytest.approx(radius, rel=1e-6)
    # The log density of ||W|| = r: (numel - 1) log r - 2 lam g(r^2) / s, maximized on a grid.
    grid = torch.linspace(0.5, 6.0, 20001, dtype=torch.float64)
    weights = grid[:, None] * torch.ones(1, numel, dtype=torch.float64) / math.sqrt(numel)
    log_density = (numel - 1) * grid.log() - 2 * torch.stack(
        [penalty(w, kind, lam) for w in weights]
    ) / s
    assert float(grid[log_density.argmax()]) == pytest.approx(radius, abs=1e-3)
    assert stationary_radius(kind, 0.0, numel, s) == math.inf
