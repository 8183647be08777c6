"""HORST, HAM, the mirror maps and the operators: messages, defaults, restore, bookkeeping.

A user error is one sentence naming the bad value and the allowed range, so the sentences are
pinned whole. Expected values come from torch.optim.AdamW and SGD or from the update rules
written here; the fast paths' routing is checked by standing in for the compiled kernels
(`_fast.compiled_*_step`) with recorders, so no compiler is needed.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from convergent.optim import (
    HAM,
    HORST,
    EuclideanMap,
    HorstHyperparameters,
    HyperbolicEntropyMap,
    _fast,
    first_nonfinite,
    ham_mirror_step,
    horst_mirror_direction,
    horst_reference_step,
    sign_direction,
)
from convergent.optim._validation import check_gradient

F64 = torch.float64


def _matrix_and_vector(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=generator, dtype=F64).requires_grad_(),
            torch.randn(3, generator=generator, dtype=F64).requires_grad_()]  # fmt: skip


def _grads(params, step: int):
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]


def _run(optimizer, params, steps: int):
    for step in range(steps):
        for param, grad in zip(params, _grads(params, step), strict=True):
            param.grad = grad
        optimizer.step()
    return [param.detach().clone() for param in params]


# --- HORST: the sentences -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"lr": math.inf}, ValueError, r"^lr must be a finite number >= 0, got inf\.$"),
        ({"eps": -1.0}, ValueError, r"^eps must be a finite number >= 0, got -1\.0\.$"),
        ({"lr": True}, TypeError, r"^lr must be a real number, got True of type bool\.$"),
        ({"lr": "0.1"}, TypeError, r"^lr must be a real number, got '0\.1' of type str\.$"),
        ({"lr": torch.tensor([0.1, 0.2])}, TypeError,
         r"^lr must be a real number, got tensor\(\[0\.1000, 0\.2000\]\) of type Tensor\.$"),
        ({"betas": (0.9, 0.99, 0.999)}, TypeError,
         r"^betas must be a pair \(beta1, beta2\), got \(0\.9, 0\.99, 0\.999\)\.$"),
        ({"betas": 0.9}, TypeError, r"^betas must be a pair \(beta1, beta2\), got 0\.9\.$"),
        ({"betas": (0.9, "0.999")}, TypeError,
         r"^betas\[1\] must be a real number, got '0\.999' of type str\.$"),
        ({"betas": (0.9, 1.0)}, ValueError, r"^betas\[1\] must be in \[0, 1\), got 1\.0\.$"),
        ({"betas": (-0.1, 0.9)}, ValueError, r"^betas\[0\] must be in \[0, 1\), got -0\.1\.$"),
        ({"exponent_clamp": 0.0}, ValueError,
         r"^exponent_clamp must be None or a number > 0, got 0\.0\.$"),
        ({"exponent_clamp": "big"}, TypeError,
         r"^exponent_clamp must be a real number, got 'big' of type str\.$"),
        ({"mirror": "yes"}, TypeError,
         r"^mirror must be None \(automatic\), True or False, got 'yes'\.$"),
        ({"maximize": True}, ValueError,
         r"^HORST supports maximize=False only, got maximize=True; negate the loss\.$"),
        ({"implementation": "fast"}, ValueError,
         r"^implementation must be one of \('auto', 'reference', 'foreach', 'compiled'\), "
         r"got 'fast'\.$"),
        ({"nonfinite": "warn"}, ValueError,
         r"^nonfinite must be one of \('raise', 'skip', 'ignore'\), got 'warn'\.$"),
        ({"mirror_map": "hyperbolic"}, TypeError, r"^mirror_map must be a MirrorMap, got str\.$"),
        ({"mirror_map": EuclideanMap(), "implementation": "foreach"}, ValueError,
         r"^implementation='foreach' supports HyperbolicEntropyMap\(0\.0\) only\.$"),
        ({"mirror_map": HyperbolicEntropyMap(0.5), "implementation": "compiled"}, ValueError,
         r"^implementation='compiled' supports HyperbolicEntropyMap\(0\.0\) only\.$"),
    ],
)  # fmt: skip
def test_horst_errors_are_one_sentence_naming_the_value(options, error, message):
    with pytest.raises(error, match=message):
        HORST([torch.zeros(2, 2, requires_grad=True)], **options)


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ({"maximize": True},
         r"^HORST supports maximize=False only, got maximize=True; negate the loss\.$"),
        ({"lr": -1.0}, r"^lr must be a finite number >= 0, got -1\.0\.$"),
        ({"weight_decay": math.nan}, r"^weight_decay must be a finite number >= 0, got nan\.$"),
        ({"alpha": -2}, r"^alpha must be a finite number >= 0, got -2\.$"),
        ({"beta": math.inf}, r"^beta must be a finite number >= 0, got inf\.$"),
    ],
)  # fmt: skip
def test_horst_group_options_are_checked_like_the_defaults(group, message):
    optimizer = HORST([torch.zeros(2, 2, requires_grad=True)])
    with pytest.raises(ValueError, match=message):
        optimizer.add_param_group({"params": [torch.zeros(3, requires_grad=True)], **group})
    assert len(optimizer.param_groups) == 1


def test_boundary_values_are_accepted_and_a_one_element_tensor_is_a_number():
    param = torch.ones(2, 2, requires_grad=True)
    optimizer = HORST([param], lr=torch.tensor(0.0), betas=(0.0, 0.0), eps=0.0, weight_decay=0.0,
                      alpha=0.0, beta=0.0, exponent_clamp=0.5)  # fmt: skip
    param.grad = torch.ones_like(param)
    optimizer.step()  # lr = 0: nothing moves
    assert torch.equal(param.detach(), torch.ones(2, 2))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_unsupported_gradients_name_the_parameter():
    integer = torch.zeros(2, dtype=torch.long)
    integer.grad = torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match=r"^parameter 0 of param group 0 \(shape \[2\]\) has dtype "
                                        r"torch\.int64; only floating-point parameters are "
                                        r"supported\.$"):  # fmt: skip
        HORST([integer]).step()
    weight = torch.zeros(3, 2)
    # Autograd refuses to store a CSR gradient, so the check is called as the optimizers do.
    with pytest.raises(TypeError, match=r"^w has a sparse gradient; only dense \(strided\) "
                                        r"gradients are supported\.$"):  # fmt: skip
        check_gradient("w", weight, torch.zeros(3, 2).to_sparse_csr())
    complex_sentence = r"^w is complex; only real floating-point parameters are supported\.$"
    for param, grad in ((torch.zeros(2, dtype=torch.complex64), torch.zeros(2)),
                        (torch.zeros(2), torch.zeros(2, dtype=torch.complex64))):  # fmt: skip
        with pytest.raises(TypeError, match=complex_sentence):  # either side complex
            check_gradient("w", param, grad)


def test_nonfinite_error_names_an_unnamed_parameter_by_group_index_and_shape():
    first, second, third = (torch.zeros(shape, dtype=F64, requires_grad=True)
                            for shape in ((2,), (3,), (2, 2)))  # fmt: skip
    optimizer = HORST([{"params": [first]}, {"params": [second, third]}], lr=0.1)
    for param in (first, second, third):
        param.grad = torch.ones_like(param)
    third.grad[1, 0] = math.inf
    with pytest.raises(ValueError, match=r"^HORST: the gradient of parameter 1 of param group 1 "
                                         r"\(shape \[2, 2\]\) is not finite; pass "
                                         r"nonfinite='skip' to skip such steps\.$"):  # fmt: skip
        optimizer.step()


def test_nonfinite_search_sums_wide_enough():
    # float16 sums past 65504 and float64 sums past float32's range are finite: no false alarm.
    assert first_nonfinite([torch.full((40_000,), 100.0, dtype=torch.float16)]) is None
    assert first_nonfinite([torch.full((3,), 1e300, dtype=F64)]) is None
    assert first_nonfinite([torch.ones(2), torch.tensor([1.0, -math.inf], dtype=F64)]) == 1


# --- HORST: defaults, the other mirror maps, restore ---------------------------------------------


def test_horst_defaults_are_adamws_and_the_documented_mirror_options():
    params, twins = _matrix_and_vector(), _matrix_and_vector()
    horst = HORST(params, alpha=0.0)
    got = _run(horst, params, 3)
    want = _run(torch.optim.AdamW(twins), twins, 3)  # torch's defaults: lr 1e-3, wd 1e-2
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    defaults = HORST(_matrix_and_vector()).param_groups[0]
    assert defaults["alpha"] is None and defaults["strength"] == 0.2 and defaults["beta"] == 0.0
    assert defaults["mirror"] is None and defaults["exponent_clamp"] is None
    fresh = HORST(_matrix_and_vector())
    assert fresh.implementation == "auto" and fresh.nonfinite == "raise"
    assert fresh.skipped_steps == 0 and fresh.fallback_reason is None
    assert fresh.tensor_steps == {"reference": 0, "foreach": 0, "compiled": 0}


def test_a_positive_scale_map_runs_the_reference_mirror_formula():
    theta = torch.tensor([[0.3, -1.2], [2.0, -0.05]], dtype=F64)
    grad = torch.tensor([[0.5, -0.1], [-2.0, 0.3]], dtype=F64)
    param = theta.clone().requires_grad_()
    lr, wd, alpha, beta, eps, gamma = 0.1, 0.2, 2.0, 0.5, 1e-8, 0.5
    optimizer = HORST([param], lr=lr, weight_decay=wd, alpha=alpha, beta=beta,
                      mirror_map=HyperbolicEntropyMap(gamma))  # fmt: skip
    assert optimizer.implementation == "reference"
    param.grad = grad
    optimizer.step()
    u = lr * grad / (grad.abs() + eps)  # step 1: m_hat = g, v_hat = g^2
    half = theta * (1 - lr * wd) - u
    dual = torch.asinh(half / gamma) - (alpha * u + lr * beta * torch.sign(half))
    torch.testing.assert_close(param.detach(), gamma * torch.sinh(dual), rtol=1e-12, atol=1e-14)
    assert optimizer.tensor_steps == {"reference": 1, "foreach": 0, "compiled": 0}


def test_an_adamw_checkpoint_gets_horsts_options_and_no_skipped_steps():
    params = _matrix_and_vector()
    adamw = torch.optim.AdamW(params, lr=0.01)
    _run(adamw, params, 2)
    horst = HORST(_matrix_and_vector(), lr=0.5, alpha=3.0, beta=0.2, exponent_clamp=0.1)
    horst.load_state_dict(copy.deepcopy(adamw.state_dict()))
    group = horst.param_groups[0]
    assert group["lr"] == 0.01  # the checkpoint's
    assert (group["alpha"], group["beta"], group["exponent_clamp"]) == (3.0, 0.2, 0.1)
    assert group["mirror"] is None and horst.skipped_steps == 0


# --- HORST: which path stepped what -------------------------------------------------------------


class _RecordingCompiled:
    """Stands in for `_fast.compiled_horst_step`: checks what the real kernel needs, records it
    and applies the foreach step (so the result must equal the reference path)."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, thetas, grads, exp_avgs, exp_avg_sqs, steps, flags, **options):
        for theta, grad in zip(thetas, grads, strict=True):
            assert theta.is_contiguous() and grad.is_contiguous() and theta.numel() >= 2
            self.shapes.append(tuple(theta.shape))
        options.pop("polynomial")  # float64 here: never the polynomial
        _fast.foreach_horst_step(thetas, grads, exp_avgs, exp_avg_sqs, steps, flags, **options)


def _mixed_params():
    generator = torch.Generator().manual_seed(7)
    return [
        torch.randn(4, 3, generator=generator, dtype=F64).requires_grad_(),  # compilable
        torch.randn(2, generator=generator, dtype=F64).requires_grad_(),  # two: compilable
        torch.randn(1, generator=generator, dtype=F64).requires_grad_(),  # one element
        torch.randn(4, 3, generator=generator, dtype=F64).t().requires_grad_(),  # strided view
    ]


def test_compiled_horst_steps_what_it_can_and_foreach_the_rest(monkeypatch):
    recorder = _RecordingCompiled()
    monkeypatch.setattr(_fast, "compiler_unavailable_reason", lambda device: None)
    monkeypatch.setattr(_fast, "compiled_horst_step", recorder)
    options = {"lr": 0.05, "alpha": 3.0, "beta": 0.2, "mirror": True}
    params, twins = _mixed_params(), _mixed_params()
    optimizer = HORST(params, implementation="compiled", **options)
    got = _run(optimizer, params, 3)
    want = _run(HORST(twins, implementation="reference", **options), twins, 3)
    for have, expected in zip(got, want, strict=True):
        torch.testing.assert_close(have, expected, rtol=1e-12, atol=1e-14)
    assert recorder.shapes == [(4, 3), (2,)] * 3
    assert optimizer.tensor_steps == {"reference": 0, "foreach": 6, "compiled": 6}
    assert optimizer.fallback_reason is None


def test_auto_compiles_groups_of_two_to_the_twenty_elements(monkeypatch):
    recorder = _RecordingCompiled()
    monkeypatch.setattr(_fast, "compiler_unavailable_reason", lambda device: None)
    monkeypatch.setattr(_fast, "compiled_horst_step", recorder)
    large = torch.zeros(1024, 1024, requires_grad=True)
    small = torch.zeros(1024, 1023, requires_grad=True)
    optimizer = HORST([{"params": [large]}, {"params": [small]}])
    large.grad, small.grad = torch.ones_like(large), torch.ones_like(small)
    optimizer.step()
    assert recorder.shapes == [(1024, 1024)]
    assert optimizer.tensor_steps == {"reference": 0, "foreach": 1, "compiled": 1}


def test_a_failed_compile_warns_once_with_the_optimizers_name(monkeypatch):
    monkeypatch.setattr(_fast, "compiler_unavailable_reason", lambda device: None)
    monkeypatch.setattr(_fast, "compiled_horst_step", lambda *a, **k: "torch.compile failed (x)")
    params, twins = _mixed_params(), _mixed_params()
    optimizer = HORST(params, lr=0.05, alpha=2.0, implementation="compiled")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(optimizer, params, 2)
    assert [str(w.message) for w in caught] == [
        "HORST: torch.compile failed (x); using the foreach implementation instead."
    ]
    assert optimizer.implementation == "foreach"
    assert optimizer.fallback_reason == "torch.compile failed (x)"
    assert optimizer.tensor_steps == {"reference": 0, "foreach": 8, "compiled": 0}
    want = _run(HORST(twins, lr=0.05, alpha=2.0, implementation="foreach"), twins, 2)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# --- HAM ------------------------------------------------------------------------------------


def _ham_expected(params, steps, lr, alpha, beta, mirror=None):
    """SGD's step, then w * exp(lr * (-alpha * sign(w) * grad - beta)) on the mirrored tensors."""
    weights = [param.detach().clone() for param in params]
    for step in range(steps):
        for index, (weight, grad) in enumerate(zip(weights, _grads(params, step), strict=True)):
            half = weight - lr * grad
            if weight.ndim >= 2 if mirror is None else mirror:
                half = half * torch.exp(lr * (-alpha * torch.sign(half) * grad - beta))
            weights[index] = half
    return weights


@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 0.0), (3.0, 0.0), (0.0, 0.5), (0.0, 1.0)])
def test_ham_mirrors_whenever_alpha_or_beta_is_nonzero(alpha, beta):
    params = _matrix_and_vector(seed=1)
    start = [param.detach().clone() for param in params]
    optimizer = HAM(
        torch.optim.SGD(params, lr=0.1), alpha=alpha, beta=beta, implementation="foreach"
    )
    got = _run(optimizer, params, 2)
    for have, want in zip(got, _ham_expected(start, 2, 0.1, alpha, beta), strict=True):
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-14)
    assert optimizer.tensor_steps == {"foreach": 2, "compiled": 0}


def test_ham_with_alpha_and_beta_zero_is_the_base_step_and_no_mirror_work():
    params, twins = _matrix_and_vector(), _matrix_and_vector()
    optimizer = HAM(torch.optim.SGD(params, lr=0.1), alpha=0.0, beta=0.0)
    got = _run(optimizer, params, 2)
    want = _run(torch.optim.SGD(twins, lr=0.1), twins, 2)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert optimizer.tensor_steps == {"foreach": 0, "compiled": 0}


def test_ham_leaves_a_matrix_without_gradient_alone():
    generator = torch.Generator().manual_seed(2)
    moving, frozen = (torch.randn(3, 3, generator=generator, dtype=F64).requires_grad_()
                      for _ in range(2))  # fmt: skip
    before = frozen.detach().clone()
    optimizer = HAM(torch.optim.SGD([moving, frozen], lr=0.1), alpha=2.0, beta=0.5)
    moving.grad = torch.ones_like(moving)
    optimizer.step()
    assert torch.equal(frozen.detach(), before) and frozen.grad is None
    assert optimizer.tensor_steps["foreach"] == 1


def test_ham_defaults_and_sentences():
    ham = HAM(torch.optim.SGD(_matrix_and_vector(), lr=0.1))
    group = ham.param_groups[0]
    assert (group["ham_alpha"], group["ham_beta"], group["ham_mirror"]) == (200.0, 1e-3, None)
    assert ham.implementation == "auto" and ham.fallback_reason is None
    assert ham.state is ham.base_optimizer.state and ham.skipped_steps == 0
    with pytest.raises(TypeError, match=r"^base_optimizer must be a torch\.optim\.Optimizer, "
                                        r"got list\.$"):  # fmt: skip
        HAM(_matrix_and_vector())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^implementation must be one of \('auto', 'foreach', "
                                         r"'compiled'\), got 'fast'\.$"):  # fmt: skip
        HAM(torch.optim.SGD(_matrix_and_vector(), lr=0.1), implementation="fast")
    with pytest.raises(TypeError, match=r"^mirror must be None \(automatic\), True or False, "
                                        r"got 'yes'\.$"):  # fmt: skip
        HAM(torch.optim.SGD(_matrix_and_vector(), lr=0.1), mirror="yes")  # type: ignore[arg-type]
    extra = {"params": [torch.zeros(2, requires_grad=True)]}
    with pytest.raises(ValueError, match=r"^alpha must be a finite number >= 0, got -1\.$"):
        ham.add_param_group({**extra, "ham_alpha": -1})
    with pytest.raises(ValueError, match=r"^beta must be a finite number >= 0, got inf\.$"):
        ham.add_param_group({**extra, "ham_beta": math.inf})
    assert len(ham.param_groups) == len(ham.base_optimizer.param_groups) == 1
    ham.add_param_group({**extra, "ham_beta": 0.5})  # reaches the base once, with HAM's defaults
    assert ham.param_groups is ham.base_optimizer.param_groups and len(ham.param_groups) == 2
    added = ham.param_groups[1]
    assert (added["ham_alpha"], added["ham_beta"], added["lr"]) == (200.0, 0.5, 0.1)


def test_ham_loads_a_plain_base_checkpoint_with_its_own_defaults():
    params = _matrix_and_vector()
    adamw = torch.optim.AdamW(params, lr=0.01)
    _run(adamw, params, 2)
    copies = [param.detach().clone().requires_grad_() for param in params]
    ham = HAM(torch.optim.AdamW(copies, lr=0.5), alpha=4.0, beta=0.3, mirror=True)
    ham.load_state_dict(copy.deepcopy(adamw.state_dict()))
    group = ham.param_groups[0]
    assert (group["ham_alpha"], group["ham_beta"], group["ham_mirror"]) == (4.0, 0.3, True)
    assert ham.param_groups is ham.base_optimizer.param_groups
    assert ham.state is ham.base_optimizer.state
    assert float(ham.state[copies[0]]["step"]) == 2.0 and ham.skipped_steps == 0


def test_ham_names_itself_and_the_parameter_in_the_nonfinite_error():
    params = _matrix_and_vector()
    ham = HAM(torch.optim.SGD(params, lr=0.1), alpha=2.0)
    for param in params:
        param.grad = torch.ones_like(param)
    params[0].grad[2, 1] = math.nan
    with pytest.raises(ValueError, match=r"^HAM: the gradient of parameter 0 of param group 0 "
                                         r"\(shape \[4, 3\]\) is not finite; pass "
                                         r"nonfinite='skip' to skip such steps\.$"):  # fmt: skip
        ham.step()


def test_ham_zero_grad_and_closure_reach_the_base_optimizer():
    params = _matrix_and_vector()
    ham = HAM(torch.optim.SGD(params, lr=0.1), alpha=2.0, beta=0.1)
    for param in params:
        param.grad = torch.ones_like(param)
    ham.zero_grad()
    assert all(param.grad is None for param in params)
    for param in params:
        param.grad = torch.ones_like(param)
    ham.zero_grad(set_to_none=False)
    assert all(torch.equal(param.grad, torch.zeros_like(param)) for param in params)

    assert ham.step() is None  # no closure, no loss
    start = [param.detach().clone() for param in params]
    calls = []

    def closure():
        calls.append(1)
        ham.zero_grad()
        loss = sum(
            (param * grad).sum() for param, grad in zip(params, _grads(params, 0), strict=True)
        )
        loss.backward()
        return loss

    loss = ham.step(closure)
    assert calls == [1] and torch.is_tensor(loss)
    want = sum((param * grad).sum() for param, grad in zip(start, _grads(params, 0), strict=True))
    assert float(loss.detach()) == pytest.approx(float(want.detach()))
    for have, expected in zip(params, _ham_expected(start, 1, 0.1, 2.0, 0.1), strict=True):
        torch.testing.assert_close(have.detach(), expected, rtol=1e-12, atol=1e-14)


class _RecordingHamCompiled:
    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, weights, grads, *, lr, alpha, beta):
        for weight, grad in zip(weights, grads, strict=True):
            assert weight.is_contiguous() and grad.is_contiguous()
            self.shapes.append(tuple(weight.shape))
            weight.mul_(torch.exp(lr * (-alpha * torch.sign(weight) * grad - beta)))


def test_compiled_ham_steps_contiguous_weights_and_foreach_the_rest(monkeypatch):
    recorder = _RecordingHamCompiled()
    monkeypatch.setattr(_fast, "compiler_unavailable_reason", lambda device: None)
    monkeypatch.setattr(_fast, "compiled_ham_step", recorder)
    params = _mixed_params()
    start = [param.detach().clone() for param in params]
    optimizer = HAM(torch.optim.SGD(params, lr=0.1), alpha=2.0, beta=0.4, mirror=True,
                    implementation="compiled")  # fmt: skip
    got = _run(optimizer, params, 2)
    for have, want in zip(got, _ham_expected(start, 2, 0.1, 2.0, 0.4, mirror=True), strict=True):
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-14)
    assert recorder.shapes == [(4, 3), (2,), (1,)] * 2
    assert optimizer.tensor_steps == {"foreach": 2, "compiled": 6}


def test_a_failed_ham_compile_warns_once_with_its_name(monkeypatch):
    monkeypatch.setattr(_fast, "compiler_unavailable_reason", lambda device: None)
    monkeypatch.setattr(_fast, "compiled_ham_step", lambda *a, **k: "torch.compile failed (y)")
    params = _matrix_and_vector()
    optimizer = HAM(torch.optim.SGD(params, lr=0.1), alpha=2.0, implementation="compiled")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(optimizer, params, 2)
    assert [str(w.message) for w in caught] == [
        "HAM: torch.compile failed (y); using the foreach implementation instead."
    ]
    assert optimizer.fallback_reason == "torch.compile failed (y)"
    assert optimizer.tensor_steps == {"foreach": 2, "compiled": 0}


# --- mirror maps and operators ----------------------------------------------------------------


def test_mirror_map_defaults_sentences_and_reprs():
    assert HyperbolicEntropyMap().scale == 0.0  # the multiplicative limit of HORST
    assert repr(HyperbolicEntropyMap()) == "HyperbolicEntropyMap(scale=0.0)"
    assert repr(EuclideanMap()) == "EuclideanMap()"
    for scale in (math.inf, math.nan, -0.5, "1"):
        with pytest.raises(
            ValueError, match=rf"^scale must be a finite number >= 0, got {scale!r}"
        ):
            HyperbolicEntropyMap(scale)  # type: ignore[arg-type]
    sentence = (r"^HyperbolicEntropyMap\(scale=0\) has no finite dual coordinates; use step\(\), "
                r"or a scale > 0\.$")  # fmt: skip
    with pytest.raises(ValueError, match=sentence):
        HyperbolicEntropyMap(0.0).grad_psi(torch.ones(2))
    with pytest.raises(ValueError, match=sentence):
        HyperbolicEntropyMap(0.0).grad_psi_star(torch.ones(2))


def test_operators_follow_their_formulas_at_zero_weights_and_with_defaults():
    half = torch.tensor([0.0, 1.0, -2.0, 0.5], dtype=F64)
    direction = torch.tensor([0.1, 0.2, -0.3, -0.05], dtype=F64)
    want = 2.0 * direction + 0.5 * 0.4 * torch.sign(half)  # alpha u + lr beta sign(half)
    got = horst_mirror_direction(half, direction, alpha=2.0, lr=0.5, beta=0.4)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    clamped = horst_mirror_direction(half, direction, alpha=2.0, lr=0.5, beta=0.4,
                                     exponent_clamp=0.3)  # fmt: skip
    torch.testing.assert_close(clamped, want.clamp(-0.3, 0.3), rtol=0, atol=1e-15)

    grad = torch.tensor([0.3, -1.0, 0.2, 0.0], dtype=F64)
    moved = ham_mirror_step(half, grad, lr=0.1, alpha=2.0, beta=0.5)
    want = half * torch.exp(0.1 * (-2.0 * torch.sign(half) * grad - 0.5))
    torch.testing.assert_close(moved, want, rtol=1e-15, atol=0)
    assert moved[0] == 0.0  # a zero weight stays zero
    torch.testing.assert_close(sign_direction(grad, lr=0.1), 0.1 * torch.sign(grad))

    theta = torch.tensor([[0.3, -1.2], [2.0, -0.05]], dtype=F64)
    g = torch.tensor([[0.5, -0.1], [-2.0, 0.3]], dtype=F64)
    m, v = torch.zeros_like(theta), torch.zeros_like(theta)
    # Without `mirror`, the step is M∘S: AdamW's first step, then the multiplicative mirror.
    hyperparameters = HorstHyperparameters(lr=0.1, beta1=0.9, beta2=0.999, eps=0.0,
                                           weight_decay=0.0, alpha=2.0, beta=0.5)  # fmt: skip
    got = horst_reference_step(theta, g, m, v, hyperparameters, step=1)
    u = 0.1 * torch.sign(g)
    after_s = theta - u
    want = after_s * torch.exp(-2.0 * torch.sign(after_s) * u - 0.1 * 0.5)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
