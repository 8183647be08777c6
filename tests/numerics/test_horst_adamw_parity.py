"""Known answer: HORST with alpha = beta = 0 is torch.optim.AdamW, on every implementation."""

from __future__ import annotations

import pytest
import torch

from convergent.optim import HORST, _fast

SHAPES = [(5, 7), (7,), (3, 4, 2), (11, 3), (1,)]
STEPS = 60


def _trajectory(make_optimizer, dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)
    params = [
        torch.randn(shape, dtype=dtype, generator=generator).requires_grad_() for shape in SHAPES
    ]
    groups = [
        {"params": params[:2], "lr": 0.01, "weight_decay": 0.0},
        {"params": params[2:4], "lr": 0.003, "weight_decay": 0.1, "betas": (0.8, 0.99)},
        {"params": params[4:], "lr": 0.02, "weight_decay": 0.5, "eps": 1e-6},
    ]
    optimizer = make_optimizer(groups)
    for step in range(STEPS):
        for index, param in enumerate(params):
            # Gradients that shrink over time exercise the eps and bias-correction arithmetic.
            param.grad = torch.randn(param.shape, dtype=dtype, generator=generator) / (1 + step)
            if step % 7 == 3 and index == 1:
                param.grad = None  # a parameter without a gradient this step
        optimizer.step()
    return [param.detach() for param in params]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_alpha_zero_is_adamw_bit_for_bit(implementation, foreach):
    expected = _trajectory(lambda groups: torch.optim.AdamW(groups, foreach=foreach))
    actual = _trajectory(
        lambda groups: HORST(groups, alpha=0.0, beta=0.0, implementation=implementation)
    )
    for want, got in zip(expected, actual, strict=True):
        assert torch.equal(want, got)


@pytest.mark.skipif(
    _fast.compiler_unavailable_reason(torch.device("cpu")) is not None,
    reason="no compiled path on this machine",
)
def test_alpha_zero_compiled_matches_adamw_to_round_off():
    expected = _trajectory(lambda groups: torch.optim.AdamW(groups))
    built = []

    def compiled(groups):
        built.append(HORST(groups, alpha=0.0, beta=0.0, implementation="compiled"))
        return built[-1]

    actual = _trajectory(compiled)
    assert built[0].fallback_reason is None and built[0].tensor_steps["compiled"] > 0
    for want, got in zip(expected, actual, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-15)


def test_mirror_switched_off_is_adamw_with_alpha_nonzero():
    expected = _trajectory(lambda groups: torch.optim.AdamW(groups))
    actual = _trajectory(
        lambda groups: HORST(groups, alpha=5.0, beta=0.3, mirror=False, implementation="foreach")
    )
    for want, got in zip(expected, actual, strict=True):
        assert torch.equal(want, got)
