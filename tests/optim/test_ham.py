"""HAM wraps any optimizer: the mirror step, state_dict, param groups and schedulers."""

from __future__ import annotations

import copy

import pytest
import torch

from convergent.optim import HAM, _fast, ham_mirror_step


def _params(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=generator, dtype=torch.float64).requires_grad_(),
            torch.randn(3, generator=generator, dtype=torch.float64).requires_grad_()]  # fmt: skip


def _grads(step):
    generator = torch.Generator().manual_seed(50 + step)
    return [torch.randn(4, 3, generator=generator, dtype=torch.float64),
            torch.randn(3, generator=generator, dtype=torch.float64)]  # fmt: skip


def _run(optimizer, params, steps, start=0, scheduler=None):
    for step in range(start, start + steps):
        for param, grad in zip(params, _grads(step), strict=True):
            param.grad = grad
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def test_ham_is_the_base_step_then_the_mirror_step_on_matrices():
    params, expected = _params(), _params()
    ham = HAM(torch.optim.AdamW(params, lr=0.01), alpha=20.0, beta=0.5)
    base = torch.optim.AdamW(expected, lr=0.01)
    for step in range(5):
        _run(ham, params, 1, start=step)
        _run(base, expected, 1, start=step)
        with torch.no_grad():
            expected[0].copy_(
                ham_mirror_step(expected[0], expected[0].grad, lr=0.01, alpha=20.0, beta=0.5)
            )
    torch.testing.assert_close(params[0].detach(), expected[0].detach(), rtol=1e-14, atol=0)
    assert torch.equal(params[1].detach(), expected[1].detach())  # vectors: base step only


def test_state_dict_is_the_base_state_dict_and_round_trips():
    params = _params()
    ham = HAM(torch.optim.Adam(params, lr=0.01), alpha=5.0)
    _run(ham, params, 3)
    state = copy.deepcopy(ham.state_dict())
    assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert state["param_groups"][0]["ham_alpha"] == 5.0
    copies = [param.detach().clone().requires_grad_() for param in params]
    _run(ham, params, 3, start=3)

    resumed = HAM(torch.optim.Adam(copies, lr=0.5), alpha=1.0)
    resumed.load_state_dict(state)
    assert resumed.param_groups is resumed.base_optimizer.param_groups
    assert resumed.param_groups[0]["ham_alpha"] == 5.0 and resumed.param_groups[0]["lr"] == 0.01
    _run(resumed, copies, 3, start=3)
    for want, got in zip(params, copies, strict=True):
        assert torch.equal(want.detach(), got.detach())


def test_scheduler_and_param_groups_reach_the_base_optimizer():
    params = _params()
    base = torch.optim.SGD([params[0]], lr=0.1)
    ham = HAM(base)
    ham.add_param_group({"params": [params[1]], "lr": 0.2, "ham_mirror": True})
    assert len(base.param_groups) == 2 and base.param_groups[1]["ham_mirror"] is True
    scheduler = torch.optim.lr_scheduler.ExponentialLR(ham, gamma=0.5)
    _run(ham, params, 2, scheduler=scheduler)
    assert [group["lr"] for group in base.param_groups] == pytest.approx([0.025, 0.05])
    ham.load_state_dict(copy.deepcopy(ham.state_dict()))
    scheduler.step()
    assert base.param_groups is ham.param_groups
    assert ham.base_optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)


def test_mirror_switch_and_bad_input():
    params, expected = _params(), _params()
    ham = HAM(torch.optim.SGD(params, lr=0.1), alpha=3.0, mirror=False)
    _run(ham, params, 2)
    _run(torch.optim.SGD(expected, lr=0.1), expected, 2)
    assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(params, expected, strict=True))
    with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
        HAM(torch.optim.SGD(_params(), lr=0.1), alpha=-1.0)
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        HAM(torch.optim.SGD(_params(), lr=0.1), beta=-1.0)
    with pytest.raises(TypeError, match=r"base_optimizer must be a torch\.optim\.Optimizer"):
        HAM(_params())  # type: ignore[arg-type]


def test_mirror_factor_keeps_signs():
    theta = torch.randn(100, 10, dtype=torch.float64)
    grad = torch.randn_like(theta) * 2
    moved = ham_mirror_step(theta, grad, lr=0.1, alpha=200.0, beta=1e-3)
    assert torch.equal(torch.sign(moved), torch.sign(theta))


def test_grad_scaler_steps_through_ham():
    params, expected = _params(), _params()
    params = [param.detach().float().requires_grad_() for param in params]
    expected = [param.detach().float().requires_grad_() for param in expected]
    ham = HAM(torch.optim.AdamW(params, lr=0.01), alpha=20.0)
    plain = HAM(torch.optim.AdamW(expected, lr=0.01), alpha=20.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    for step in range(3):
        grads = _grads(step)
        ham.zero_grad()
        scaler.scale(
            sum((param * grad.float()).sum() for param, grad in zip(params, grads, strict=True))
        ).backward()
        scaler.step(ham)
        scaler.update()
        for param, grad in zip(expected, grads, strict=True):
            param.grad = grad.float()
        plain.step()
    for want, got in zip(expected, params, strict=True):
        assert torch.equal(want.detach(), got.detach())


@pytest.mark.skipif(
    _fast.compiler_unavailable_reason(torch.device("cpu")) is not None,
    reason="no compiled path on this machine",
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_mirror_step_equals_the_foreach_one(dtype):
    results = []
    for implementation in ("foreach", "compiled"):
        params = [param.detach().to(dtype).requires_grad_() for param in _params()]
        optimizer = HAM(torch.optim.SGD(params, lr=0.05), alpha=20.0, beta=0.5,
                        mirror=True, implementation=implementation)  # fmt: skip
        for step in range(6):
            for param, grad in zip(params, _grads(step), strict=True):
                param.grad = grad.to(dtype)
            optimizer.step()
        assert optimizer.fallback_reason is None  # proof of the path
        assert optimizer.tensor_steps[implementation] == 6 * 2
        results.append([param.detach() for param in params])
    tolerance = {"rtol": 1e-13, "atol": 0} if dtype == torch.float64 else {}
    for want, got, start in zip(*results, _params(), strict=True):
        assert not torch.equal(want, start.detach().to(dtype))  # the steps moved it
        torch.testing.assert_close(got, want, **tolerance)


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="implementation must be one of"):
        HAM(torch.optim.SGD(_params(), lr=0.1), implementation="fast")


def test_missing_compiler_falls_back_to_foreach_with_one_warning(monkeypatch):
    import warnings

    from convergent.optim import _fast

    monkeypatch.setattr(_fast, "compiler_unavailable_reason", lambda device: "no compiler")
    results = []
    for implementation in ("foreach", "compiled"):
        params = _params()
        optimizer = HAM(torch.optim.SGD(params, lr=0.05), alpha=20.0, beta=0.5,
                        implementation=implementation)  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _run(optimizer, params, 3)
        results.append([param.detach() for param in params])
    assert [str(w.message) for w in caught] == [
        "HAM: no compiler; using the foreach implementation instead."
    ]
    assert optimizer.implementation == "foreach" and optimizer.fallback_reason == "no compiler"
    assert optimizer.tensor_steps == {"foreach": 3, "compiled": 0}
    for want, got in zip(*results, strict=True):
        assert torch.equal(want, got)
