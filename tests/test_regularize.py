from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers import BertConfig, BertModel

from convergent.losses import task_loss
from convergent.models import HFEncoder, Transformer, TransformerConfig
from convergent.models.lora import add_query_key_lora, lora_parameters
from convergent.optim.langevin import Langevin
from convergent.regularize import (
    RegularizedStep,
    VillaniRegularizer,
    flat_potential,
    lam_for_stationary_radius,
    log_amplified_penalty,
    penalty,
    select_parameters,
    stationary_radius,
    super_quadratic_penalty,
    villani_along_ray,
    villani_quantity,
)
from convergent.train import fit
from tests.conftest import TensorDataset


def _transformer(n_layers: int = 2) -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(task="regression", input_dim=4, num_outputs=3, pooling="mean",
                               d_model=8, n_heads=1, n_layers=n_layers, max_len=5)  # fmt: skip
    return Transformer(config)


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
    ours = select_parameters(_transformer(), "query_key")
    assert list(ours) == [f"blocks.{i}.attention.{p}_proj.weight" for i in (0, 1) for p in "qk"]
    bert = select_parameters(_tiny_bert(), "query_key")
    assert list(bert) == [f"encoder.layer.{i}.attention.self.{p}.weight" for i in (0, 1)
                          for p in ("query", "key")]  # fmt: skip


def test_glob_and_regex_patterns():
    model = _transformer()
    assert list(select_parameters(model, "*.0.attention.q_proj.*", syntax="glob")) == [
        "blocks.0.attention.q_proj.weight", "blocks.0.attention.q_proj.bias"]  # fmt: skip
    assert list(select_parameters(model, [r"k_proj\.bias$"])) == [
        "blocks.0.attention.k_proj.bias", "blocks.1.attention.k_proj.bias"]  # fmt: skip


def test_a_pattern_that_matches_nothing_names_it_and_lists_close_matches():
    with pytest.raises(ValueError, match=r"pattern 'q_prj' \(regex\) matches no parameter of "
                       r"Transformer; close matches: blocks\.0\.attention\.q_proj\.weight"):  # fmt: skip
        select_parameters(_transformer(), ["q_proj", "q_prj"])
    with pytest.raises(
        ValueError, match=r"pattern 'query' .* close matches: .*blocks\.0\.attention\.q_proj"
    ):
        select_parameters(_transformer(), "query")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        select_parameters(_transformer(), "q_proj[")


def test_regularizer_sums_the_penalties_and_reports_norms():
    model = _transformer()
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


def _lora_model():
    model = add_query_key_lora(_transformer(), rank=2)
    with torch.no_grad():  # PEFT starts B at zero; make the products non-zero for the tests
        for name, parameter in lora_parameters(model).items():
            if ".lora_B." in name:
                parameter.normal_(0, 0.5)
    return model


def test_lora_factors_and_products():
    model = _lora_model()
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
        VillaniRegularizer(_transformer(), product=True)


def test_lora_on_bert_targets_query_and_key():
    model = add_query_key_lora(HFEncoder(_tiny_bert(), task="regression", num_outputs=1), rank=2)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    assert len(names) == 8
    assert all(".query.lora_" in name or ".key.lora_" in name for name in names)


def test_langevin_with_a_regularizer_trains_only_lora_factors():
    # The few lines a user writes: PEFT LoRA on q/k, a regularizer on the factors, Langevin.
    model = _lora_model()
    regularizer = VillaniRegularizer(model, "lora", penalty="log", lam=1e-3)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = Langevin(trainable, lr=0.05, s=1e-4, seed=0)

    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    factors = {n: p.detach().clone() for n, p in lora_parameters(model).items()}
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(inputs=torch.randn(64, 5, 4, generator=generator),
                         labels=torch.randn(64, 3, generator=generator))  # fmt: skip
    result = fit(model, optimizer, data, max_steps=5, batch_size=16, task="regression",
                 training_step=RegularizedStep("regression", regularizer), progress=False,
                 tensorboard=False)  # fmt: skip
    assert "penalty" in result.history[-1] and any(
        k.startswith("norm/") for k in result.history[-1]
    )
    for name, parameter in model.named_parameters():
        if name in frozen:
            assert torch.equal(parameter, frozen[name]), name
    assert all(not torch.equal(lora_parameters(model)[n], value) for n, value in factors.items())


def test_regularized_step_adds_the_penalty():
    model = _transformer()
    regularizer = VillaniRegularizer(model, "query_key", lam=2.0)
    batch = {"inputs": torch.randn(4, 5, 4), "labels": torch.randn(4, 3)}
    objective, metrics = RegularizedStep("regression", regularizer).loss(model, batch)
    expected = (
        task_loss(model(inputs=batch["inputs"]).logits, batch["labels"], "regression")
        + regularizer()
    )
    assert float(objective.detach()) == pytest.approx(float(expected.detach()))
    assert metrics["objective"] == pytest.approx(metrics["loss"] + metrics["penalty"])


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
