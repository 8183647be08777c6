"""Enforcement: re-masking after every step keeps pruned weights at zero; state resets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from convergent.optim import HAM, HORST
from convergent.sparse import Masks, MaskSpec, magnitude_masks, reset_optimizer_state
from convergent.train import ErmStep, fit
from convergent.train.masked import MaskedStep
from tests.conftest import make_classification


class ThreeLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 24)
        self.middle = nn.Linear(24, 24)
        self.head = nn.Linear(24, 3)

    def forward(self, inputs: torch.Tensor) -> SimpleNamespace:
        hidden = torch.tanh(self.middle(torch.tanh(self.first(inputs))))
        return SimpleNamespace(logits=self.head(hidden))


def _optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.1)
    if kind == "horst":
        return HORST(model.parameters(), lr=3e-2, weight_decay=0.1, alpha=1.0)
    return HAM(torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.1), alpha=5.0)


def _names(model: nn.Module) -> list[str]:
    return MaskSpec(include_first=True, include_last=True).select(model).names


@pytest.mark.parametrize("kind", ["adamw", "horst", "ham"])
def test_momentum_and_weight_decay_do_not_revive_pruned_weights(kind):
    torch.manual_seed(0)
    model = ThreeLayers()
    optimizer = _optimizer(kind, model)
    step = MaskedStep(ErmStep("classification"), optimizer, _names(model), sparsity=0.7)
    fit(model, optimizer, make_classification(), max_steps=25, batch_size=16, progress=False)
    # Warm the moments up densely first, then train sparse: momentum is non-zero everywhere.
    fit(model, optimizer, make_classification(), max_steps=50, batch_size=16, progress=False,
        training_step=step, tensorboard=False)  # fmt: skip
    assert step.masks is not None
    parameters = dict(model.named_parameters())
    for name, mask in step.masks.items():
        assert (parameters[name][~mask] == 0).all(), name
        assert (parameters[name][mask] != 0).all(), name
    assert step.masks.sparsity() == pytest.approx(0.7, abs=1 / step.masks.numel)


@pytest.mark.parametrize("kind", ["adamw", "horst"])
def test_without_re_masking_the_optimizer_revives_pruned_weights(kind):
    # The control for the test above: a mask applied once does not hold.
    torch.manual_seed(0)
    model = ThreeLayers()
    optimizer = _optimizer(kind, model)
    fit(model, optimizer, make_classification(), max_steps=5, batch_size=16, progress=False)
    masks = magnitude_masks(model, _names(model), 0.7)
    masks.apply(model)
    fit(model, optimizer, make_classification(), max_steps=10, batch_size=16, progress=False)
    parameters = dict(model.named_parameters())
    revived = sum(int((parameters[name][~mask] != 0).sum()) for name, mask in masks.items())
    assert revived > 0


def _trained_adamw() -> tuple[nn.Module, torch.optim.Optimizer, Masks]:
    torch.manual_seed(0)
    model = ThreeLayers()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fit(model, optimizer, make_classification(), max_steps=3, batch_size=16, progress=False)
    return model, optimizer, magnitude_masks(model, _names(model), 0.5)


@pytest.mark.parametrize(
    "reset,how,first,second",
    [
        ("none", "mask", "kept", "kept"),
        ("momentum", "mask", "masked", "kept"),
        ("momentum", "zero", "zero", "kept"),
        ("moments", "mask", "masked", "masked"),
        ("moments", "zero", "zero", "zero"),
    ],
)
def test_reset_options(reset, how, first, second):
    model, optimizer, masks = _trained_adamw()
    parameters = dict(model.named_parameters())
    before = {
        name: {k: v.clone() for k, v in optimizer.state[parameters[name]].items()} for name in masks
    }
    reset_optimizer_state(optimizer, model, masks, reset, how)
    for name, mask in masks.items():
        state = optimizer.state[parameters[name]]
        assert torch.equal(state["step"], before[name]["step"])
        for key, expected in (("exp_avg", first), ("exp_avg_sq", second)):
            old = before[name][key]
            want = {"kept": old, "masked": old * mask, "zero": torch.zeros_like(old)}[expected]
            assert torch.equal(state[key], want), (key, expected)


def test_reset_reaches_ham_and_sgd_state():
    torch.manual_seed(0)
    model = ThreeLayers()
    for optimizer in (
        HAM(torch.optim.AdamW(model.parameters(), lr=1e-2)),
        torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9),
    ):
        fit(model, optimizer, make_classification(), max_steps=2, batch_size=16, progress=False)
        masks = magnitude_masks(model, _names(model), 0.5)
        assert reset_optimizer_state(optimizer, model, masks, "momentum", "zero") == len(masks)
        parameters = dict(model.named_parameters())
        for name in masks:
            state = optimizer.state[parameters[name]]
            momentum = state.get("exp_avg", state.get("momentum_buffer"))
            assert (momentum == 0).all()


def test_bad_reset_names_the_choices():
    model, optimizer, masks = _trained_adamw()
    with pytest.raises(ValueError, match="reset must be one of none, momentum, moments"):
        reset_optimizer_state(optimizer, model, masks, "everything")
    with pytest.raises(ValueError, match="sparsity must be in"):
        MaskedStep(None, optimizer, list(masks), sparsity=-0.1)
