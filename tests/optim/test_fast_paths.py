"""The compiled paths' shortcuts: exp by a polynomial where a bound proves the exponent small,
the bound itself (against torch.optim.AdamW's own moments), chunked calls, and HAM's one-pass
AdamW + mirror step (against torch.optim.AdamW followed by the mirror step written here)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from convergent.optim import HAM, HORST, HorstHyperparameters, _fast
from convergent.optim.horst import RATIO_BOUND

F64 = torch.float64
requires_compiler = pytest.mark.skipif(
    _fast.compiler_unavailable_reason(torch.device("cpu")) is not None,
    reason="no compiled path on this machine",
)


def test_exp_polynomial_is_exp_to_2_pow_minus_33_within_its_limit_and_not_beyond():
    limit = _fast.POLYNOMIAL_EXPONENT_LIMIT
    x = torch.linspace(-limit, limit, 20001, dtype=F64)
    want = np.exp(x.numpy())
    relative = np.abs(_fast.exp_polynomial(x).numpy() - want) / want
    assert relative.max() < 2.0**-33
    # The truncation error grows as |x|^6 / 720: at 0.5 it is far above float32 rounding.
    assert abs(_fast.exp_polynomial(torch.tensor(0.5, dtype=F64)).item() - math.exp(0.5)) > 1e-6


def _adversarial_gradients(steps: int, seed: int) -> list[torch.Tensor]:
    """Long quiet stretches, then a burst: what drives |m| / sqrt(v) to its largest."""
    generator = torch.Generator().manual_seed(seed)
    grads = []
    for step in range(steps):
        scale = 1e-6 if step % 40 < 30 else 1.0
        grads.append(torch.randn(64, generator=generator, dtype=F64).sign() * scale)
    return grads


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9), (0.0, 0.99), (0.99, 0.999)])
def test_the_ratio_bound_holds_for_torch_adamw_moments_even_when_betas_change(betas):
    param = torch.zeros(64, dtype=F64, requires_grad=True)
    adamw = torch.optim.AdamW([param], lr=1e-3, betas=betas)
    bound, worst = 0.0, 0.0
    for step, grad in enumerate(_adversarial_gradients(200, seed=1)):
        if step == 100:  # a scheduler or a user may change the betas
            adamw.param_groups[0]["betas"] = (betas[0] ** 0.5, betas[1])
        beta1, beta2 = adamw.param_groups[0]["betas"]
        param.grad = grad
        adamw.step()
        bound = _fast.adam_ratio_bound(bound, beta1, beta2)
        state = adamw.state[param]
        ratio = (state["exp_avg"].abs() / state["exp_avg_sq"].sqrt()).max().item()
        worst = max(worst, ratio / bound)
        assert ratio <= bound * (1 + 1e-12), (step, ratio, bound)
    assert worst > 0.3  # the gradients push the ratio near the bound (it is not vacuous)


def test_the_exponent_bound_covers_the_adam_direction_torch_takes():
    lr, alpha, beta = 1e-2, 3.0, 0.5
    param = torch.zeros(64, dtype=F64, requires_grad=True)
    adamw = torch.optim.AdamW([param], lr=lr, weight_decay=0.0)
    bound = 0.0
    for step, grad in enumerate(_adversarial_gradients(120, seed=2), start=1):
        before = param.detach().clone()
        param.grad = grad
        adamw.step()
        direction = (before - param.detach()).abs().max().item()  # |u|, weight decay off
        bound = _fast.adam_ratio_bound(bound, 0.9, 0.999)
        hyperparameters = HorstHyperparameters(
            lr=lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, alpha=alpha, beta=beta
        )
        exponent = _fast.horst_exponent_bound(bound, step, hyperparameters)
        assert alpha * direction + lr * beta <= exponent * (1 + 1e-12)


def _params(dtype, count, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (11,), (3, 4, 2), (9,)]
    return [
        torch.randn(shapes[i % 4], generator=generator, dtype=dtype).requires_grad_()
        for i in range(count)
    ]


def _run_horst(params, steps, seed=5, **kwargs):
    generator = torch.Generator().manual_seed(seed)
    optimizer = HORST(params, **kwargs)
    for _ in range(steps):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator, dtype=param.dtype)
        optimizer.step()
    return optimizer


class _Spy:
    """Wraps `_fast.compiled_horst_step`, recording (dtype, polynomial) per call."""

    def __init__(self, real):
        self.real, self.choices = real, set()

    def __call__(self, *args, **kwargs):
        self.choices.add((args[0][0].dtype, kwargs.get("polynomial", False)))
        return self.real(*args, **kwargs)


@requires_compiler
@pytest.mark.parametrize(("lr", "polynomial"), [(1e-4, True), (0.05, False)])
def test_compiled_horst_takes_the_polynomial_only_when_bounded_and_equals_the_reference(
    monkeypatch, lr, polynomial
):
    # Two compiled calls of 4 tensors (small chunks: each chunk length is a compile).
    monkeypatch.setattr(_fast, "CHUNK_TENSORS", 4)
    count = 8
    spy = _Spy(_fast.compiled_horst_step)
    monkeypatch.setattr(_fast, "compiled_horst_step", spy)
    results, starts = {}, {}
    for dtype in (F64, torch.float32):
        for implementation in ("reference", "compiled"):
            params = _params(dtype, count)
            starts[dtype] = [p.detach().clone() for p in params]
            # float32: one step, so that the bound below is a bound on one step's rounding.
            steps = 4 if dtype == F64 else 1
            optimizer = _run_horst(
                params, steps, lr=lr, alpha=2.0, beta=0.1, implementation=implementation
            )
            results[dtype, implementation] = [p.detach() for p in params]
        assert optimizer.tensor_steps["compiled"] == steps * count
    # float64 always calls exp: the polynomial's 2^-33 is float32 accuracy, not float64's.
    assert spy.choices == {(F64, False), (torch.float32, polynomial)}
    for want, got in zip(results[F64, "reference"], results[F64, "compiled"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    # float32: within 4 ulp of the larger of the weight before and after the step (theta - u
    # cancels, so the rounding is that of the operands, not of the difference).
    pairs = zip(
        results[torch.float32, "reference"],
        results[torch.float32, "compiled"],
        starts[torch.float32],
        strict=True,
    )
    for want, got, start in pairs:
        scale = torch.maximum(want.abs(), start.abs())
        assert ((got - want).abs() <= 4 * torch.finfo(torch.float32).eps * scale).all()


def test_a_horst_state_loaded_from_adamw_measures_its_ratio_bound():
    params = _params(F64, 2)
    adamw = torch.optim.AdamW(params, lr=1e-3)
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator, dtype=F64)
        adamw.step()
    horst = HORST(params, lr=1e-3)
    horst.load_state_dict(adamw.state_dict())
    measured = [
        (adamw.state[p]["exp_avg"].abs() / adamw.state[p]["exp_avg_sq"].sqrt()).max().item()
        for p in params
    ]
    horst.step()  # the same gradients again
    for param, ratio in zip(params, measured, strict=True):
        want = 0.9 / 0.999**0.5 * ratio + 0.1 / 0.001**0.5
        assert horst.state[param][RATIO_BOUND] == pytest.approx(want, rel=1e-12)


def _ham_by_hand(params, grads_per_step, lr, alpha, beta, weight_decay):
    """torch.optim.AdamW's step, then w <- w * exp(lr * (-alpha * sign(w) * g - beta)) on
    tensors with ndim >= 2, written here."""
    adamw = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)
    for grads in grads_per_step:
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad.clone()
        adamw.step()
        with torch.no_grad():
            for param, grad in zip(params, grads, strict=True):
                if param.ndim >= 2:
                    param.mul_(torch.exp(lr * (-alpha * torch.sign(param) * grad - beta)))
    return adamw


@requires_compiler
@pytest.mark.parametrize(("alpha", "polynomial"), [(10.0, True), (200.0, False)])
def test_ham_around_adamw_runs_in_one_pass_and_equals_adamw_then_the_mirror(
    monkeypatch, alpha, polynomial
):
    spy = _Spy(_fast.compiled_horst_step)
    monkeypatch.setattr(_fast, "compiled_horst_step", spy)
    monkeypatch.setattr(_fast, "CHUNK_TENSORS", 4)
    lr, beta, weight_decay, steps = 1e-3, 1e-3, 0.01, 5
    for dtype, tolerance in ((F64, {"rtol": 1e-12, "atol": 1e-14}), (torch.float32, {})):
        generator = torch.Generator().manual_seed(4)
        start = _params(dtype, 4, seed=3)
        grads = [
            [torch.randn(p.shape, generator=generator, dtype=dtype) for p in start]
            for _ in range(steps)
        ]
        by_hand = [p.detach().clone().requires_grad_() for p in start]
        reference = _ham_by_hand(by_hand, grads, lr, alpha, beta, weight_decay)
        params = [p.detach().clone().requires_grad_() for p in start]
        base = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
        ham = HAM(base, alpha=alpha, beta=beta, implementation="compiled")
        for step_grads in grads:
            for param, grad in zip(params, step_grads, strict=True):
                param.grad = grad.clone()
            ham.step()
        assert ham.fused_steps == steps and ham.fallback_reason is None
        for want, got in zip(by_hand, params, strict=True):
            torch.testing.assert_close(got.detach(), want.detach(), **tolerance)
        # AdamW's own state, as AdamW writes it: training resumes under plain AdamW.
        for param, twin in zip(params, by_hand, strict=True):
            mine, theirs = base.state[param], reference.state[twin]
            assert float(mine["step"]) == float(theirs["step"]) == steps
            torch.testing.assert_close(mine["exp_avg"], theirs["exp_avg"], **tolerance)
            torch.testing.assert_close(mine["exp_avg_sq"], theirs["exp_avg_sq"], **tolerance)
    # float64 always calls exp: the polynomial's 2^-33 is float32 accuracy, not float64's.
    assert spy.choices == {(F64, False), (torch.float32, polynomial)}


def test_ham_around_adamw_with_amsgrad_takes_the_two_pass_path():
    params = _params(F64, 2)
    for param in params:
        param.grad = torch.ones_like(param)
    ham = HAM(torch.optim.AdamW(params, lr=1e-3, amsgrad=True), implementation="compiled")
    ham.step()
    assert ham.fused_steps == 0
