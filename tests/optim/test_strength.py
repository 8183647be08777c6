"""HORST's strength in user units: alpha x mean|theta| and the measured mirror/AdamW ratio."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from convergent.optim import HAM, HORST, ham_move_ratio, horst_move_ratio, horst_strength
from convergent.train import HorstStrengthLog


def _stepped(alpha: float, size: float) -> HORST:
    generator = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (40, 30), generator=generator).double() * 2 - 1
    matrix = torch.nn.Parameter(signs * size)  # every |theta| equals size
    bias = torch.nn.Parameter(torch.full((30,), 0.5, dtype=torch.float64))
    optimizer = HORST(
        [{"params": [matrix]}, {"params": [bias]}], lr=1e-4, alpha=alpha, weight_decay=0.0
    )
    matrix.grad = torch.randn(40, 30, generator=generator, dtype=torch.float64)
    bias.grad = torch.randn(30, generator=generator, dtype=torch.float64)
    optimizer.step()
    return optimizer


def test_strength_is_alpha_times_the_mean_magnitude_of_the_mirrored_tensors():
    optimizer = _stepped(alpha=50.0, size=0.02)
    matrix_group, bias_group = horst_strength(optimizer)
    mean = float(optimizer.param_groups[0]["params"][0].detach().abs().mean())
    assert matrix_group["mean_abs"] == pytest.approx(mean, rel=1e-12)
    assert matrix_group["alpha_times_mean_abs"] == pytest.approx(50.0 * mean, rel=1e-12)
    assert matrix_group["mirrored"] == 1200
    assert math.isnan(bias_group["mean_abs"]) and bias_group["mirrored"] == 0  # ndim 1: no mirror


@pytest.mark.parametrize("alpha", [1.0, 20.0, 100.0])
def test_the_measured_ratio_matches_alpha_times_the_magnitude_when_all_are_equal(alpha):
    # With every |theta| = c, each element's mirror move is ~ alpha * c * |u| to first order,
    # so ||mirror|| / ||u|| = alpha * c (the bias group adds Adam move only: left out here).
    optimizer = _stepped(alpha=alpha, size=0.02)
    optimizer.param_groups[1]["lr"] = 0.0  # the bias would add AdamW move without mirror
    ratio = horst_move_ratio(optimizer)
    matrix = optimizer.param_groups[0]["params"][0].detach()
    assert ratio == pytest.approx(alpha * float(matrix.abs().mean()), rel=0.02)


def test_the_log_callback_writes_one_line_per_evaluation_and_at_the_end(caplog):
    optimizer = _stepped(alpha=20.0, size=0.02)
    log = HorstStrengthLog(optimizer)
    with caplog.at_level(logging.INFO, logger="convergent.train.callbacks"):
        log.on_evaluate(10, {})
        log.on_fit_end(SimpleNamespace(step=10))  # already logged at this step
        log.on_fit_end(SimpleNamespace(step=12))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("step 10: HORST mirror/AdamW move ratio")
    assert [step for step, _, _ in log.records] == [10, 12]
    assert log.records[0][2][0] == pytest.approx(
        horst_strength(optimizer)[0]["alpha_times_mean_abs"]
    )


# --- strength: alpha set from the weights' scale ----------------------------------------------


def _one_step(optimizer_for, std: float, grad_scale: float, seed: int = 0):
    """One step on a 60x50 matrix of N(0, std^2) weights with N(0, grad_scale^2) gradients;
    returns the weights before, the gradient, the weights after and the optimizer."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(60, 50, generator=generator, dtype=torch.float64) * std
    grad = torch.randn(60, 50, generator=generator, dtype=torch.float64) * grad_scale
    param = torch.nn.Parameter(weights.clone())
    optimizer = optimizer_for([param])
    param.grad = grad.clone()
    optimizer.step()
    return weights, grad, param.detach().clone(), optimizer


def _adamw_half_step(weights, grad, lr=1e-3, weight_decay=1e-2, eps=1e-8):
    """torch.optim.AdamW's first step, written out: m_hat = g, v_hat = g^2."""
    return weights * (1 - lr * weight_decay) - lr * grad / (grad.abs() + eps)


@pytest.mark.parametrize("std", [0.02, 1.0])
@pytest.mark.parametrize("grad_scale", [1e-3, 1.0])
def test_default_horst_acts_on_any_weight_scale(std, grad_scale):
    weights, grad, after, _ = _one_step(lambda p: HORST(p), std, grad_scale)
    half = _adamw_half_step(weights, grad)
    ratio = float((after - half).norm() / (weights - half).norm())
    assert ratio >= 0.2  # the manipulation check's floor: HORST, not AdamW
    # first order: alpha |half| |u| with alpha = 0.2 / mean|w| and |u| = lr everywhere, so the
    # ratio is 0.2 x rms|w| / mean|w| (sqrt(pi/2) for normal weights) up to weight decay
    expected = 0.2 * float(weights.square().mean().sqrt() / weights.abs().mean())
    assert ratio == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize(("std", "grad_scale", "acts"), [(0.02, 1e-3, False), (1.0, 1.0, True)])
def test_ham_at_its_default_alpha_acts_only_where_weights_and_gradients_are_large(
    std, grad_scale, acts
):
    # HAM keeps the authors' alpha = 200 (a strength set at step 1 was unstable on our
    # models); its first step's ratio, written out: mirror = half (exp(-lr (200 sign g + beta))
    # - 1) after AdamW's step, against AdamW's move.
    weights, grad, after, optimizer = _one_step(
        lambda p: HAM(torch.optim.AdamW(p, lr=1e-3)), std, grad_scale
    )
    half = _adamw_half_step(weights, grad)
    mirror = half * torch.expm1(-1e-3 * (200 * torch.sign(half) * grad + 1e-3))
    torch.testing.assert_close(after - half, mirror, rtol=1e-9, atol=1e-15)
    ratio = float(mirror.norm() / (weights - half).norm())
    assert (ratio >= 0.2) is acts
    if not acts:  # first order: the next step's ratio from the moments and the same gradient
        assert ham_move_ratio(optimizer) == pytest.approx(ratio, rel=0.05)


@pytest.mark.parametrize("strength", [0.05, 0.2, 1.0])
def test_strength_gives_a_first_step_ratio_in_its_band(strength):
    weights, grad, after, optimizer = _one_step(
        lambda p: HORST(p, strength=strength, weight_decay=0.0), 0.02, 1e-2
    )
    assert optimizer.param_groups[0]["alpha"] == pytest.approx(
        strength / float(weights.abs().mean()), rel=1e-12
    )
    half = _adamw_half_step(weights, grad, weight_decay=0.0)
    ratio = float((after - half).norm() / (weights - half).norm())
    # the band: from r (Cauchy-Schwarz: rms >= mean) to r x rms/mean x 1.05 (exp's curvature)
    rms_over_mean = float(weights.square().mean().sqrt() / weights.abs().mean())
    assert strength <= ratio <= strength * rms_over_mean * 1.05
    assert horst_move_ratio(optimizer) == pytest.approx(ratio, rel=0.05)  # the next step's


def test_all_zero_tensors_are_left_out_and_an_all_zero_group_waits():
    generator = torch.Generator().manual_seed(1)
    a = torch.nn.Parameter(torch.randn(8, 4, generator=generator, dtype=torch.float64) * 0.1)
    b = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.float64))  # LoRA's B at init
    alone = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    optimizer = HORST([{"params": [a, b]}, {"params": [alone]}], lr=1e-2, strength=0.5)
    for param in (a, b, alone):
        param.grad = torch.ones_like(param)
    mean_a = float(a.detach().abs().mean())
    optimizer.step()
    first, second = optimizer.param_groups
    assert first["alpha"] == pytest.approx(0.5 / mean_a, rel=1e-12)  # b did not dilute it
    assert second["alpha"] is None  # nothing to measure: no mirror step yet
    mean_alone = float(alone.detach().abs().mean())  # the Adam step moved it off zero
    assert mean_alone > 0
    optimizer.step()
    assert second["alpha"] == pytest.approx(0.5 / mean_alone, rel=1e-12)
    rows = horst_strength(optimizer)
    assert rows[0]["strength"] == 0.5 and rows[0]["mirrored"] == 64


def test_a_resumed_run_keeps_the_measured_alpha_bit_for_bit():
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))

    inputs, targets = torch.randn(16, 6), torch.randn(16, 1)

    def train(net, optimizer, steps):
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(inputs), targets).backward()
            optimizer.step()

    straight = model()
    optimizer = HORST(straight.parameters(), lr=1e-2, strength=0.3)
    train(straight, optimizer, 6)
    first = model()
    optimizer = HORST(first.parameters(), lr=1e-2, strength=0.3)
    train(first, optimizer, 3)
    saved_alpha = optimizer.param_groups[0]["alpha"]
    state, weights = optimizer.state_dict(), first.state_dict()
    resumed = model()
    with torch.no_grad():  # different weights now: a new measurement would give another alpha
        for param in resumed.parameters():
            param.mul_(3.0)
    resumed.load_state_dict(weights)
    optimizer = HORST(resumed.parameters(), lr=1e-2, strength=0.3)
    optimizer.load_state_dict(state)
    assert optimizer.param_groups[0]["alpha"] == saved_alpha
    train(resumed, optimizer, 3)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_alpha_and_strength_together_are_one_sentence():
    param = torch.nn.Parameter(torch.ones(2, 2))
    with pytest.raises(ValueError, match="give alpha or strength, not both"):
        HORST([param], alpha=1.0, strength=0.2)
    with pytest.raises(ValueError, match="strength must be a finite number > 0, got 0"):
        HORST([param], strength=0)
    group = HORST([{"params": [param], "alpha": 3.0}]).param_groups[0]
    assert group["alpha"] == 3.0 and group["strength"] is None  # the group's own choice


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reading_the_move_ratio_changes_no_weight_and_no_moment(dtype):
    # The reading works in float64 and in place; a float64 moment must be copied first, or the
    # reading would overwrite the optimizer's state.
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(6, 5, dtype=dtype))
    optimizer = HORST([weights], lr=0.01, alpha=2.0)
    weights.grad = torch.randn_like(weights)
    optimizer.step()
    before = {
        key: value.clone()
        for key, value in optimizer.state[weights].items()
        if torch.is_tensor(value)
    }
    kept = weights.detach().clone()
    assert math.isfinite(horst_move_ratio(optimizer))
    after = optimizer.state[weights]
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert torch.equal(weights.detach(), kept)
