"""Known answers for HORST and HAM with alpha > 0 and beta > 0, on every implementation.

The expected trajectory comes from torch.optim.AdamW and the mirror formula written here,
not from convergent's own functions:

- HORST: theta_half = AdamW's step of theta (so u = (1 - lr * wd) * theta - theta_half), then
  theta_next = theta_half * exp(clamp(-alpha * sign(theta_half) * u - lr * beta)) on matrices.
- HAM (around AdamW): w_half = AdamW's step, then w_next = w_half * exp(lr * (-alpha *
  sign(w_half) * grad - beta)) on matrices, with the raw gradient.
Vectors get the AdamW step alone. AdamW's moments depend on the gradients only, so a shadow
AdamW fed the same gradients from HORST's current weights gives HORST's half step exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from convergent.optim import HAM, HORST, _fast

COMPILER = _fast.compiler_unavailable_reason(torch.device("cpu"))
requires_compiler = pytest.mark.skipif(
    COMPILER is not None, reason=f"no compiled path on this machine: {COMPILER}"
)
SHAPES = [(6, 5), (7,), (3, 4)]
LR, WD, ALPHA, BETA = 0.05, 0.1, 3.0, 0.4


def _params(dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator, dtype=dtype) for shape in SHAPES]


def _grads(step, dtype=torch.float64):
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator, dtype=dtype) for shape in SHAPES]


def _horst_expected(steps: int, clamp: float | None) -> list[torch.Tensor]:
    thetas = _params()
    shadow = [theta.clone().requires_grad_() for theta in thetas]
    adamw = torch.optim.AdamW(shadow, lr=LR, weight_decay=WD)
    for step in range(steps):
        with torch.no_grad():
            for copy, theta in zip(shadow, thetas, strict=True):
                copy.copy_(theta)
        for copy, grad in zip(shadow, _grads(step), strict=True):
            copy.grad = grad
        adamw.step()
        for index, (theta, copy) in enumerate(zip(thetas, shadow, strict=True)):
            half = copy.detach().clone()
            if theta.ndim < 2:
                thetas[index] = half
                continue
            u = (1 - LR * WD) * theta - half
            exponent = -ALPHA * torch.sign(half) * u - LR * BETA
            if clamp is not None:
                exponent = exponent.clamp(-clamp, clamp)
            thetas[index] = half * torch.exp(exponent)
    return thetas


def _horst_run(implementation: str, steps: int, clamp: float | None):
    params = [p.clone().requires_grad_() for p in _params()]
    optimizer = HORST(params, lr=LR, weight_decay=WD, alpha=ALPHA, beta=BETA,
                      exponent_clamp=clamp, implementation=implementation)  # fmt: skip
    for step in range(steps):
        for param, grad in zip(params, _grads(step), strict=True):
            param.grad = grad
        optimizer.step()
    return [p.detach() for p in params], optimizer


@pytest.mark.parametrize("clamp", [None, 0.02])
@pytest.mark.parametrize(
    "implementation",
    ["reference", "foreach", pytest.param("compiled", marks=requires_compiler)],
)
def test_horst_is_adamw_then_the_mirror_formula(implementation, clamp):
    expected = _horst_expected(8, clamp)
    got, optimizer = _horst_run(implementation, 8, clamp)
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-14)
    # the shrinkage is there: beta's share of the exponent is lr * beta (not beta, not +)
    plain, _ = _horst_run(implementation, 1, clamp)
    no_beta = HORST([p.clone().requires_grad_() for p in _params()], lr=LR, weight_decay=WD,
                    alpha=ALPHA, beta=0.0, exponent_clamp=clamp)  # fmt: skip
    for param, grad in zip(no_beta.param_groups[0]["params"], _grads(0), strict=True):
        param.grad = grad
    no_beta.step()
    ratio = plain[0] / no_beta.param_groups[0]["params"][0].detach()
    expected_ratio = math.exp(-LR * BETA) if clamp is None else None
    if expected_ratio is not None:
        torch.testing.assert_close(
            ratio, torch.full_like(ratio, expected_ratio), rtol=1e-12, atol=0
        )
    if implementation == "compiled":
        assert optimizer.fallback_reason is None, optimizer.fallback_reason
        assert optimizer.tensor_steps["compiled"] > 0 and optimizer.tensor_steps["foreach"] == 0
    else:
        assert optimizer.tensor_steps[implementation] == 8 * len(SHAPES)


def _ham_expected(steps: int) -> list[torch.Tensor]:
    weights = [p.clone().requires_grad_() for p in _params()]
    adamw = torch.optim.AdamW(weights, lr=LR, weight_decay=WD)
    for step in range(steps):
        grads = _grads(step)
        for weight, grad in zip(weights, grads, strict=True):
            weight.grad = grad
        adamw.step()
        with torch.no_grad():
            for weight, grad in zip(weights, grads, strict=True):
                if weight.ndim >= 2:
                    half = weight.detach().clone()
                    weight.copy_(half * torch.exp(LR * (-ALPHA * torch.sign(half) * grad - BETA)))
    return [w.detach() for w in weights]


@pytest.mark.parametrize(
    "implementation", ["foreach", pytest.param("compiled", marks=requires_compiler)]
)
def test_ham_is_adamw_then_the_mirror_formula(implementation):
    params = [p.clone().requires_grad_() for p in _params()]
    optimizer = HAM(torch.optim.AdamW(params, lr=LR, weight_decay=WD), alpha=ALPHA, beta=BETA,
                    implementation=implementation)  # fmt: skip
    for step in range(8):
        for param, grad in zip(params, _grads(step), strict=True):
            param.grad = grad
        optimizer.step()
    for want, have in zip(_ham_expected(8), params, strict=True):
        torch.testing.assert_close(have.detach(), want, rtol=1e-12, atol=1e-14)
    assert optimizer.fallback_reason is None
    assert optimizer.tensor_steps[implementation] == 8 * 2  # the two matrices, every step
