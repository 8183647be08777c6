"""Optimizers by name: the classes' own defaults, HAM's options routed, clear errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from convergent.optim import HAM, HORST, build_optimizer, decay_groups, optimizer_default


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def _train(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[torch.Tensor]:
    inputs = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_horst_by_name_is_horst_with_its_defaults():
    by_name, direct = _model(), _model()
    built = build_optimizer("horst", by_name.parameters(), lr=0.01, alpha=5.0)
    assert isinstance(built, HORST)
    group = built.param_groups[0]
    # The documented defaults of HORST: AdamW's betas and eps, weight decay 0.01, beta 0.
    assert group["betas"] == (0.9, 0.999) and group["eps"] == 1e-8
    assert group["weight_decay"] == 0.01 and group["beta"] == 0.0 and group["alpha"] == 5.0
    reference = HORST(direct.parameters(), lr=0.01, alpha=5.0)
    for got, want in zip(_train(built, by_name), _train(reference, direct), strict=True):
        assert torch.equal(got, want)


def test_ham_options_go_to_ham_and_the_rest_to_adamw():
    model = _model()
    built = build_optimizer("ham", model.parameters(), lr=0.02, weight_decay=0.1, alpha=7.0)
    assert isinstance(built, HAM) and isinstance(built.base_optimizer, torch.optim.AdamW)
    group = built.param_groups[0]
    assert group["lr"] == 0.02 and group["weight_decay"] == 0.1
    assert group["ham_alpha"] == 7.0 and group["ham_beta"] == 1e-3  # HAM's documented default


def test_adamw_and_sgd_by_name_are_torchs_own():
    assert type(build_optimizer("adamw", _model().parameters())) is torch.optim.AdamW
    sgd = build_optimizer("sgd", _model().parameters(), lr=0.1, momentum=0.9)
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]["momentum"] == 0.9


def test_defaults_are_read_from_the_signatures():
    assert optimizer_default("horst", "alpha") is None  # set from strength unless given
    assert optimizer_default("horst", "strength") is None  # None and None: DEFAULT_STRENGTH
    assert optimizer_default("ham", "alpha") == 200.0
    assert optimizer_default("ham", "weight_decay") == 0.01  # AdamW's, under HAM
    with pytest.raises(ValueError, match="horst has no option 'gamma'"):
        optimizer_default("horst", "gamma")


def test_unknown_names_and_options_are_one_sentence():
    with pytest.raises(ValueError, match="optimizer must be one of adamw, sgd, horst, ham, "):
        build_optimizer("lion", _model().parameters())
    with pytest.raises(ValueError, match=r"horst takes no option\(s\) \['momentum'\]"):
        build_optimizer("horst", _model().parameters(), momentum=0.9)
    with pytest.raises(ValueError, match=r"ham's AdamW takes no option\(s\) \['gamma'\]"):
        build_optimizer("ham", _model().parameters(), gamma=1.0)


def test_decay_groups_decay_matrices_only_and_skip_frozen_parameters():
    model = _model()
    model[2].bias.requires_grad_(False)
    decayed, plain = decay_groups(model, 0.05)
    assert decayed["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
    assert [tuple(p.shape) for p in decayed["params"]] == [(8, 4), (2, 8)]
    assert [tuple(p.shape) for p in plain["params"]] == [(8,), (8,), (8,)]
