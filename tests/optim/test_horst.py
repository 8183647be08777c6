"""HORST as a torch optimizer: state, closures, schedulers, AMP, param groups, bad input."""

from __future__ import annotations

import copy
import io
import math
import warnings

import pytest
import torch
from torch import nn

from convergent.optim import (
    HORST,
    EuclideanMap,
    _fast,
    adam_direction,
    horst_move_ratio,
    steepest_descent_step,
)


def _model(seed: int = 0, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).to(dtype)


def _batch(step: int, dtype=torch.float64):
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 4, generator=generator, dtype=dtype), torch.randn(
        8, 2, generator=generator, dtype=dtype
    )


def _train(model, optimizer, steps, start=0, scheduler=None):
    for step in range(start, start + steps):
        inputs, targets = _batch(step, next(model.parameters()).dtype)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_state_dict_round_trip_reproduces_the_trajectory(implementation):
    model = _model()
    optimizer = HORST(
        model.parameters(), lr=0.01, alpha=3.0, beta=0.1, implementation=implementation
    )
    _train(model, optimizer, 5)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    _train(model, optimizer, 5, start=5)

    buffer.seek(0)
    checkpoint = torch.load(buffer)
    resumed = _model(seed=1)
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer = HORST(resumed.parameters(), implementation=implementation)
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    assert resumed_optimizer.param_groups[0]["alpha"] == 3.0
    _train(resumed, resumed_optimizer, 5, start=5)
    assert torch.equal(_flat(model), _flat(resumed))


def test_loads_an_adamw_checkpoint():
    model = _model()
    adamw = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train(model, adamw, 3)
    twin = copy.deepcopy(model)
    horst = HORST(twin.parameters(), lr=0.01, alpha=0.0)
    horst.load_state_dict(copy.deepcopy(adamw.state_dict()))
    _train(model, adamw, 3, start=3)
    _train(twin, horst, 3, start=3)
    assert torch.equal(_flat(model), _flat(twin))


def test_loads_a_checkpoint_whose_step_counts_are_numbers():
    model = _model()
    adamw = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train(model, adamw, 3)
    checkpoint = copy.deepcopy(adamw.state_dict())
    for state in checkpoint["state"].values():
        state["step"] = int(state["step"])  # as torch < 1.12 wrote them
    twin = copy.deepcopy(model)
    horst = HORST(twin.parameters(), lr=0.01, alpha=0.0)
    horst.load_state_dict(checkpoint)
    _train(model, adamw, 3, start=3)
    _train(twin, horst, 3, start=3)
    assert torch.equal(_flat(model), _flat(twin))
    assert all(float(state["step"]) == 6 for state in horst.state.values())


def test_closure_is_evaluated_with_gradients_and_its_loss_returned():
    model = _model()
    optimizer = HORST(model.parameters(), lr=0.01, implementation="reference")
    inputs, targets = _batch(0)
    before = _flat(model).clone()

    def closure():
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert torch.is_tensor(loss) and loss.item() > 0
    assert not torch.equal(before, _flat(model))


def test_lr_scheduler_drives_horst_like_adamw():
    model, twin = _model(), _model()
    horst = HORST(model.parameters(), lr=0.05, alpha=0.0, implementation="foreach")
    adamw = torch.optim.AdamW(twin.parameters(), lr=0.05)
    horst_schedule = torch.optim.lr_scheduler.StepLR(horst, step_size=2, gamma=0.5)
    adamw_schedule = torch.optim.lr_scheduler.StepLR(adamw, step_size=2, gamma=0.5)
    _train(model, horst, 6, scheduler=horst_schedule)
    _train(twin, adamw, 6, scheduler=adamw_schedule)
    assert horst.param_groups[0]["lr"] == pytest.approx(0.05 / 8)
    assert torch.equal(_flat(model), _flat(twin))


def test_grad_scaler_unscales_and_skips_infinite_steps():
    model, twin = _model(dtype=torch.float32), _model(dtype=torch.float32)
    scaled = HORST(model.parameters(), lr=0.01, alpha=2.0, implementation="foreach")
    plain = HORST(twin.parameters(), lr=0.01, alpha=2.0, implementation="foreach")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for step in range(4):
        inputs, targets = _batch(step, torch.float32)
        scaled.zero_grad()
        scaler.scale(nn.functional.mse_loss(model(inputs), targets)).backward()
        scaler.step(scaled)
        scaler.update()
        _train(twin, plain, 1, start=step)
    # The scale is a power of two, so unscaling is exact.
    assert torch.equal(_flat(model), _flat(twin))

    before = _flat(model).clone()
    scaled.zero_grad()
    scaler.scale(model(torch.full((1, 4), float("inf"))).sum()).backward()
    scaler.step(scaled)
    scaler.update()
    assert torch.equal(before, _flat(model))
    assert scaler.get_scale() == 2.0**9


def test_mirror_defaults_to_matrices_and_is_switched_per_group():
    torch.manual_seed(0)
    matrix, vector = torch.randn(3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    grads = [torch.randn(3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)]

    def run(groups_for, **kwargs):
        params = [matrix.clone().requires_grad_(), vector.clone().requires_grad_()]
        optimizer = HORST(groups_for(params), lr=0.1, implementation="reference", **kwargs)
        for _ in range(3):
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad.clone()
            optimizer.step()
        return [param.detach() for param in params]

    adamw = run(lambda ps: ps, alpha=0.0)
    default = run(lambda ps: ps, alpha=5.0)
    assert not torch.equal(default[0], adamw[0]) and torch.equal(default[1], adamw[1])
    switched = run(
        lambda ps: [{"params": [ps[0]], "mirror": False}, {"params": [ps[1]], "mirror": True}],
        alpha=5.0,
    )
    assert torch.equal(switched[0], adamw[0]) and not torch.equal(switched[1], adamw[1])


def test_mirror_step_never_flips_a_sign_and_zero_weights_move():
    torch.manual_seed(0)
    param = torch.randn(64, 64, dtype=torch.float64)
    param[0, :8] = 0.0
    param = param.requires_grad_()
    exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
    optimizer = HORST([param], lr=0.5, alpha=50.0, beta=2.0, implementation="reference")
    for step in range(1, 6):
        param.grad = torch.randn_like(param) * 100
        # Where S puts each weight, computed on the side with the same operators.
        direction = adam_direction(param.grad, exp_avg, exp_avg_sq, step=step, lr=0.5,
                                   beta1=0.9, beta2=0.999, eps=1e-8)  # fmt: skip
        half = steepest_descent_step(param.detach(), direction, lr=0.5, weight_decay=0.01)
        optimizer.step()
        assert torch.equal(torch.sign(param.detach()), torch.sign(half))
        assert not torch.equal(param.detach(), half)  # the mirror step did act
    assert (param.detach()[0, :8] != 0).all()


def test_exponent_clamp_bounds_the_multiplicative_factor():
    torch.manual_seed(0)
    theta = torch.randn(50, 50, dtype=torch.float64)
    param = theta.clone().requires_grad_()
    param.grad = torch.randn_like(param)
    optimizer = HORST([param], lr=0.1, weight_decay=0.0, alpha=1e3, beta=10.0,
                      exponent_clamp=0.05, implementation="reference")  # fmt: skip
    optimizer.step()
    half = theta - 0.1 * torch.sign(param.grad)  # the first Adam step is lr * sign(grad) up to eps
    ratio = param.detach() / half
    assert (ratio > 0).all()
    assert ratio.log().abs().max() <= 0.05 + 1e-6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": -1e-3}, "lr must be a finite number >= 0"),
        ({"eps": -1.0}, "eps must be a finite number >= 0"),
        ({"weight_decay": -0.1}, "weight_decay must be a finite number >= 0"),
        ({"alpha": -1.0}, "alpha must be a finite number >= 0"),
        ({"beta": float("nan")}, "beta must be a finite number >= 0"),
        ({"betas": (0.9, 1.0)}, r"betas\[1\] must be in \[0, 1\)"),
        ({"betas": (-0.1, 0.9)}, r"betas\[0\] must be in \[0, 1\)"),
        ({"exponent_clamp": 0.0}, "exponent_clamp must be None or a number > 0"),
        ({"maximize": True}, "maximize=False only"),
        ({"implementation": "fast"}, "implementation must be one of"),
        ({"nonfinite": "warn"}, "nonfinite must be one of"),
    ],
)
def test_bad_hyperparameters_name_the_parameter_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HORST([torch.zeros(2, 2, requires_grad=True)], **kwargs)


def test_bad_param_group_and_types_are_rejected():
    optimizer = HORST([torch.zeros(2, 2, requires_grad=True)])
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        optimizer.add_param_group({"params": [torch.zeros(3, requires_grad=True)], "lr": -1.0})
    assert len(optimizer.param_groups) == 1
    with pytest.raises(TypeError, match="lr must be a real number"):
        HORST([torch.zeros(2, requires_grad=True)], lr="0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mirror must be None"):
        HORST([torch.zeros(2, requires_grad=True)], mirror="yes")  # type: ignore[arg-type]


def test_sparse_and_complex_gradients_are_rejected_by_name():
    weight = torch.zeros(3, 2, requires_grad=True)
    weight.grad = torch.zeros(3, 2).to_sparse()
    with pytest.raises(TypeError, match=r"'embedding\.weight' has a sparse gradient"):
        HORST([("embedding.weight", weight)]).step()
    complex_param = torch.zeros(2, dtype=torch.complex64, requires_grad=True)
    complex_param.grad = torch.zeros_like(complex_param)
    with pytest.raises(TypeError, match="is complex"):
        HORST([complex_param]).step()


def _random_run(implementation, dtype, steps=25, **kwargs):
    return _random_run_with_optimizer(implementation, dtype, steps, **kwargs)[0]


def _random_run_with_optimizer(implementation, dtype, steps=25, **kwargs):
    generator = torch.Generator().manual_seed(3)
    shapes = [(16, 9), (33,), (4, 5, 6), (2, 1)]
    params = [
        torch.randn(shape, generator=generator, dtype=dtype).requires_grad_() for shape in shapes
    ]
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": 0.02, "alpha": 7.0, "mirror": True,
                                         "exponent_clamp": 0.01, "weight_decay": 0.3}]  # fmt: skip
    optimizer = HORST(groups, lr=0.05, alpha=3.0, beta=0.5, implementation=implementation, **kwargs)
    for _ in range(steps):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator, dtype=dtype)
        optimizer.step()
    return [param.detach() for param in params], optimizer


_COMPILER = _fast.compiler_unavailable_reason(torch.device("cpu"))
requires_compiler = pytest.mark.skipif(
    _COMPILER is not None, reason=f"no compiled path on this machine: {_COMPILER}"
)


def _assert_ran(optimizer, implementation):
    """Proof of the path: the implementation asked for stepped the tensors, nothing else."""
    assert optimizer.fallback_reason is None, optimizer.fallback_reason
    assert optimizer.tensor_steps[implementation] > 0
    others = {k: v for k, v in optimizer.tensor_steps.items() if k != implementation}
    assert not any(others.values()), optimizer.tensor_steps


@pytest.mark.parametrize(
    "implementation", ["foreach", pytest.param("compiled", marks=requires_compiler)]
)
def test_fast_paths_equal_the_reference(implementation):
    reference = _random_run("reference", torch.float64)
    fast, optimizer = _random_run_with_optimizer(implementation, torch.float64)
    _assert_ran(optimizer, implementation)
    for want, got in zip(reference, fast, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@requires_compiler
def test_compiled_path_equals_the_reference_in_float32():
    # A second compile (float32); the kernel computes with float32 scalars like eager mode.
    reference = _random_run("reference", torch.float32, steps=10)
    fast, optimizer = _random_run_with_optimizer("compiled", torch.float32, steps=10)
    _assert_ran(optimizer, "compiled")
    for want, got in zip(reference, fast, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_compiled_path_handles_non_contiguous_parameters():
    torch.manual_seed(0)
    base = torch.randn(8, 6, dtype=torch.float64)
    params = [base.clone().t().requires_grad_(), base.clone().t().contiguous().requires_grad_()]
    optimizer = HORST([{"params": [params[0]]}], lr=0.1, implementation="compiled")
    reference = HORST([{"params": [params[1]]}], lr=0.1, implementation="reference")
    for _ in range(3):
        grad = torch.randn(6, 8, dtype=torch.float64)
        params[0].grad, params[1].grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    torch.testing.assert_close(params[0].detach(), params[1].detach(), rtol=1e-12, atol=1e-14)


def test_missing_compiler_falls_back_to_foreach_with_one_warning(monkeypatch):
    monkeypatch.setattr(
        _fast, "compiler_unavailable_reason", lambda device: "no C++ compiler was found"
    )
    reference = _random_run("foreach", torch.float64, steps=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback, optimizer = _random_run_with_optimizer("compiled", torch.float64, steps=3)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert messages == [
        "HORST: no C++ compiler was found; using the foreach implementation instead."
    ]
    assert optimizer.fallback_reason == "no C++ compiler was found"
    assert optimizer.tensor_steps == {"reference": 0, "foreach": 12, "compiled": 0}
    for want, got in zip(reference, fallback, strict=True):
        assert torch.equal(want, got)


def test_auto_uses_foreach_for_small_groups():
    optimizer = HORST([torch.zeros(3, 3, requires_grad=True)])
    assert optimizer._resolve_implementation(optimizer.param_groups[0]["params"]) == "foreach"
    assert _fast.COMPILE_MIN_NUMEL == 1 << 20


def test_other_mirror_maps_run_on_the_reference_path():
    param = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    param.grad = torch.ones_like(param)
    optimizer = HORST([param], lr=0.1, weight_decay=0.0, alpha=1.0, mirror_map=EuclideanMap())
    assert optimizer.implementation == "reference"
    optimizer.step()
    # Euclidean M: theta_half - alpha * u, so the step is (1 + alpha) * u = 0.2 (eps aside).
    torch.testing.assert_close(param.detach(), torch.full((2, 2), 0.8, dtype=torch.float64))
    with pytest.raises(ValueError, match="supports HyperbolicEntropyMap"):
        HORST([param], mirror_map=EuclideanMap(), implementation="compiled")


def test_move_ratio_after_one_step_matches_adamw_formulas():
    generator = torch.Generator().manual_seed(3)
    weight = nn.Parameter(0.02 * torch.randn(3, 4, generator=generator, dtype=torch.float64))
    bias = nn.Parameter(torch.randn(3, generator=generator, dtype=torch.float64))
    gradients = [torch.randn(3, 4, generator=generator, dtype=torch.float64),
                 torch.randn(3, generator=generator, dtype=torch.float64)]  # fmt: skip
    lr, weight_decay, alpha, beta, eps = 0.01, 0.1, 2.0, 0.05, 1e-8
    beta1, beta2 = 0.9, 0.999
    optimizer = HORST([weight, bias], lr=lr, betas=(beta1, beta2), eps=eps,
                      weight_decay=weight_decay, alpha=alpha, beta=beta)  # fmt: skip
    for param, gradient in zip((weight, bias), gradients, strict=True):
        param.grad = gradient.clone()
    optimizer.step()
    # After one step t = 1: m = (1 - beta1) g and v = (1 - beta2) g^2, so m_hat = g, v_hat = g^2.
    mirror_norm, adam_norm = 0.0, 0.0
    for param, gradient in zip((weight, bias), gradients, strict=True):
        theta = param.detach()
        m_hat = (1 - beta1) * gradient / (1 - beta1)
        v_hat = (1 - beta2) * gradient**2 / (1 - beta2)
        u = lr * m_hat / (v_hat.sqrt() + eps)
        half = theta - u - lr * weight_decay * theta
        adam_norm += float(((theta - half) ** 2).sum())
        if param.ndim >= 2:  # HORST mirrors matrices only by default; the bias moves by S alone
            exponent = -alpha * torch.sign(half) * u - lr * beta
            mirror_norm += float(((half * (torch.exp(exponent) - 1)) ** 2).sum())
    expected = (mirror_norm / adam_norm) ** 0.5
    assert 0.001 < expected < 1.0
    assert horst_move_ratio(optimizer) == pytest.approx(expected, rel=1e-9)
    assert optimizer.state[weight]["step"] == 1  # measuring applied nothing
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    assert math.isnan(horst_move_ratio(optimizer))
    assert math.isnan(horst_move_ratio(HORST([nn.Parameter(torch.ones(2, 2))])))  # no state yet


@requires_compiler
def test_a_failed_compile_falls_back_for_that_optimizer_only(monkeypatch):
    def broken(*args, **kwargs):
        return "torch.compile failed (a test)"

    with monkeypatch.context() as patch:
        patch.setattr(_fast, "compiled_horst_step", broken)
        with pytest.warns(RuntimeWarning, match="torch.compile failed \\(a test\\)"):
            _, first = _random_run_with_optimizer("compiled", torch.float64, steps=2)
    assert first.fallback_reason == "torch.compile failed (a test)"
    assert first.implementation == "foreach" and first.tensor_steps["compiled"] == 0
    _, second = _random_run_with_optimizer("compiled", torch.float64, steps=2)
    assert second.fallback_reason is None and second.tensor_steps["compiled"] > 0
