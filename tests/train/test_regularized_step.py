"""`RegularizedStep`: the task loss plus a Villani penalty, alone and inside `fit`."""

from __future__ import annotations

import pytest
import torch

from convergent.losses import task_loss
from convergent.models.lora import lora_parameters
from convergent.optim.langevin import Langevin
from convergent.regularize import VillaniRegularizer
from convergent.train import RegularizedStep, TrainingStep, fit
from tests.conftest import TensorDataset, tiny_lora_model, tiny_regression_transformer


def test_regularized_step_adds_the_penalty():
    model = tiny_regression_transformer()
    regularizer = VillaniRegularizer(model, "query_key", lam=2.0)
    batch = {"inputs": torch.randn(4, 5, 4), "labels": torch.randn(4, 3)}
    objective, metrics = RegularizedStep("regression", regularizer).loss(model, batch)
    expected = (
        task_loss(model(inputs=batch["inputs"]).logits, batch["labels"], "regression")
        + regularizer()
    )
    assert float(objective.detach()) == pytest.approx(float(expected.detach()))
    assert metrics["objective"] == pytest.approx(metrics["loss"] + metrics["penalty"])


def test_langevin_with_a_regularizer_trains_only_lora_factors():
    # The few lines a user writes: PEFT LoRA on q/k, a regularizer on the factors, Langevin.
    model = tiny_lora_model()
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


def test_regularized_step_reports_norms_only_when_the_regularizer_has_them():
    model = tiny_regression_transformer()
    step = RegularizedStep("regression", VillaniRegularizer(model, "query_key", lam=1.0))
    assert isinstance(step, TrainingStep)
    norms = step.after_optimizer_step(model)
    assert set(norms) == {
        f"norm/blocks.{i}.attention.{p}_proj.weight" for i in (0, 1) for p in "qk"
    }
    weight = model.get_parameter("blocks.0.attention.q_proj.weight").detach()
    assert norms["norm/blocks.0.attention.q_proj.weight"] == pytest.approx(float(weight.norm()))
    plain = RegularizedStep("regression", lambda: torch.tensor(0.5))
    assert plain.after_optimizer_step(model) == {}
    with pytest.raises(ValueError, match=r"task must be one of .*, got .ranking."):
        RegularizedStep("ranking", lambda: torch.tensor(0.0))
