"""A NaN or infinite gradient: HORST, HAM and Langevin raise or skip the whole step, alike."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from convergent.optim import HAM, HORST, Langevin, _fast, first_nonfinite
from convergent.optim._nonfinite import abs_maxima

_NO_COMPILER = _fast.compiler_unavailable_reason(torch.device("cpu"))
_compiled = pytest.mark.skipif(_NO_COMPILER is not None, reason=f"no compiler: {_NO_COMPILER}")


def _horst(implementation):
    def build(params, **options):
        return HORST(params, lr=0.01, alpha=2.0, beta=0.1, implementation=implementation, **options)

    return build


def _ham(implementation):
    def build(params, **options):
        base = torch.optim.AdamW(params, lr=0.01)
        return HAM(base, alpha=20.0, beta=0.5, implementation=implementation, **options)

    return build


def _langevin(implementation, preconditioned=False):
    def build(params, **options):
        return Langevin(params, lr=0.01, s=0.5, seed=3, preconditioned=preconditioned,
                        implementation=implementation, **options)  # fmt: skip

    return build


# Every optimizer on every implementation (Langevin's two update paths each, with and without
# the preconditioner's state).
BUILDERS = [
    pytest.param(_horst("reference"), id="HORST-reference"),
    pytest.param(_horst("foreach"), id="HORST-foreach"),
    pytest.param(_horst("compiled"), id="HORST-compiled", marks=_compiled),
    pytest.param(_ham("foreach"), id="HAM-foreach"),
    pytest.param(_ham("compiled"), id="HAM-compiled", marks=_compiled),
    pytest.param(_langevin("reference"), id="Langevin-reference"),
    pytest.param(_langevin("foreach"), id="Langevin-foreach"),
    pytest.param(_langevin("reference", True), id="Langevin-reference-preconditioned"),
    pytest.param(_langevin("foreach", True), id="Langevin-foreach-preconditioned"),
]
BAD_VALUES = [pytest.param(float("nan"), id="nan"), pytest.param(float("inf"), id="inf")]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).double()


def _set_grads(model: nn.Module, step: int, bad: float | None = None) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for param in model.parameters():
        param.grad = torch.randn(param.shape, generator=generator, dtype=param.dtype)
    if bad is not None:  # one bad entry, in the third of four tensors ("2.weight")
        model[2].weight.grad[1, 3] = bad


def _steps(model: nn.Module, optimizer, steps, start: int = 0) -> None:
    for step in range(start, start + steps):
        _set_grads(model, step)
        optimizer.step()


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [param.detach().clone() for param in model.parameters()]


def _equal(first, second) -> bool:
    """Bitwise equality of nested state dicts (tensors, numbers, strings, lists, dicts)."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(_equal(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(_equal, first, second))
    return first == second


def _without_count(state: dict) -> dict:
    return {k: v for k, v in state.items() if k not in ("skipped_steps", "ham_skipped_steps")}


def _stepped(state: dict) -> dict:
    """What a step changes: per-parameter state and, for Langevin, the noise generators."""
    return {k: v for k, v in state.items() if k in ("state", "noise")}


def _same_weights(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize("build", BUILDERS)
def test_raise_names_the_parameter_and_changes_nothing(build, bad):
    model = _model()
    optimizer = build(model.named_parameters())
    assert optimizer.nonfinite == "raise"  # the default
    _steps(model, optimizer, 2)  # so that there is state to keep
    weights, state = _weights(model), copy.deepcopy(optimizer.state_dict())
    _set_grads(model, 2, bad)
    message = r"the gradient of parameter '2\.weight' is not finite; pass nonfinite='skip'"
    with pytest.raises(ValueError, match=message) as raised:
        optimizer.step()
    # Also a FloatingPointError, so a tuning grid records the point as diverged.
    assert isinstance(raised.value, FloatingPointError)
    assert _same_weights(weights, _weights(model))
    assert _equal(state, optimizer.state_dict())  # moments, step counts, noise generators
    assert optimizer.skipped_steps == 0


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize("build", BUILDERS)
def test_skip_changes_nothing_and_the_next_step_is_a_fresh_optimizers(build, bad):
    model = _model()
    optimizer = build(model.parameters(), nonfinite="skip")
    _steps(model, optimizer, 2)
    weights, state = _weights(model), copy.deepcopy(optimizer.state_dict())
    _set_grads(model, 2, bad)
    optimizer.step()
    assert optimizer.skipped_steps == 1
    assert _same_weights(weights, _weights(model))
    assert _equal(_without_count(state), _without_count(optimizer.state_dict()))

    # A fresh optimizer loaded with the state from before the bad step takes the same step.
    fresh_model = _model()
    with torch.no_grad():
        for param, weight in zip(fresh_model.parameters(), weights, strict=True):
            param.copy_(weight)
    fresh = build(fresh_model.parameters(), nonfinite="skip")
    fresh.load_state_dict(copy.deepcopy(state))
    _steps(model, optimizer, 1, start=3)
    _steps(fresh_model, fresh, 1, start=3)
    assert not _same_weights(weights, _weights(model))  # the finite step did move
    assert _same_weights(_weights(fresh_model), _weights(model))
    # (not the groups: loading a state dict adds torch's "differentiable" flag to them)
    assert _equal(_stepped(fresh.state_dict()), _stepped(optimizer.state_dict()))


@pytest.mark.parametrize("build", BUILDERS)
def test_state_dict_keeps_skipped_steps_and_old_state_dicts_mean_zero(build):
    model = _model()
    optimizer = build(model.parameters(), nonfinite="skip")
    _steps(model, optimizer, 1)
    for step in (1, 2):
        _set_grads(model, step, float("nan"))
        optimizer.step()
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = build(_model().parameters(), nonfinite="skip")
    resumed.load_state_dict(saved)
    assert resumed.skipped_steps == 2
    resumed.load_state_dict(_without_count(saved))  # a checkpoint from before the count
    assert resumed.skipped_steps == 0


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
@pytest.mark.parametrize("preconditioned", [False, True])
def test_langevin_skip_does_not_advance_the_noise(implementation, preconditioned):
    build = _langevin(implementation, preconditioned)
    straight = _model()
    _steps(straight, build(straight.parameters()), 4)  # steps 0, 1, 2, 3

    skipping = _model()
    optimizer = build(skipping.parameters(), nonfinite="skip")
    _steps(skipping, optimizer, 2)
    _set_grads(skipping, 99, float("nan"))
    optimizer.step()
    _steps(skipping, optimizer, 2, start=2)
    assert optimizer.skipped_steps == 1
    assert _same_weights(_weights(straight), _weights(skipping))


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda params, **options: HORST(params, **options), id="HORST"),
        pytest.param(lambda params, **options: HAM(torch.optim.AdamW(params), **options), id="HAM"),
        pytest.param(lambda params, **options: Langevin(params, s=1.0, **options), id="Langevin"),
    ],
)
def test_unnamed_parameters_are_named_by_group_and_index_before_any_group_moves(build):
    model = _model()
    groups = [
        {"params": list(model[0].parameters())},
        {"params": list(model[2].parameters()), "lr": 0.5},
    ]
    optimizer = build(groups)
    weights = _weights(model)
    _set_grads(model, 0, float("-inf"))
    message = r"gradient of parameter 0 of param group 1 \(shape \[2, 6\]\) is not finite"
    with pytest.raises(ValueError, match=message) as raised:
        optimizer.step()
    # Also a FloatingPointError, so a tuning grid records the point as diverged.
    assert isinstance(raised.value, FloatingPointError)
    assert _same_weights(weights, _weights(model))  # group 0 did not step either
    with pytest.raises(
        ValueError, match=r"nonfinite must be one of \('raise', 'skip', 'ignore'\), got 'warn'\."
    ):
        build(model.parameters(), nonfinite="warn")


def test_ham_evaluates_the_closure_once_and_checks_it_before_the_base_step():
    model = _model()
    optimizer = HAM(torch.optim.AdamW(model.parameters(), lr=0.01), nonfinite="skip")
    inputs = torch.randn(8, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    calls = []

    def closure(scale: float = 1.0):
        calls.append(1)
        optimizer.zero_grad()
        loss = model(inputs).square().mean() * scale
        loss.backward()
        return loss

    weights = _weights(model)
    loss = optimizer.step(lambda: closure(float("inf")))
    assert len(calls) == 1 and loss == float("inf")
    assert optimizer.skipped_steps == 1 and not optimizer.base_optimizer.state
    assert _same_weights(weights, _weights(model))

    expected_model = _model()
    expected = HAM(torch.optim.AdamW(expected_model.parameters(), lr=0.01))
    expected_model(inputs).square().mean().backward()
    expected.step()
    loss = optimizer.step(closure)
    assert len(calls) == 2
    assert float(loss) == float(_model()(inputs).square().mean().detach())
    assert _same_weights(_weights(expected_model), _weights(model))


def test_ham_with_an_lbfgs_base_still_reevaluates_the_closure():
    weight = nn.Parameter(torch.tensor([3.0, -2.0], dtype=torch.float64))
    optimizer = HAM(torch.optim.LBFGS([weight], lr=1.0, max_iter=5), mirror=False)
    calls = []

    def closure():
        calls.append(1)
        optimizer.zero_grad()
        loss = (weight - 1.0).square().sum()
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert float(loss) == 13.0  # the first evaluation's loss, as LBFGS returns it
    assert len(calls) > 1
    torch.testing.assert_close(weight.detach(), torch.ones(2, dtype=torch.float64))


def test_first_nonfinite_finds_the_first_bad_tensor():
    tensors = [
        torch.ones(3),
        torch.ones(2, dtype=torch.float64),
        torch.ones(4, dtype=torch.bfloat16),
    ]
    assert first_nonfinite(tensors) is None
    # a sum beyond bfloat16's range is fine
    tensors[2] = torch.full((40_000,), 100.0, dtype=torch.bfloat16)
    assert first_nonfinite(tensors) is None
    tensors[2][7] = float("nan")
    tensors[1][0] = float("inf")
    assert first_nonfinite(tensors) == 1
    assert first_nonfinite([torch.zeros(0), torch.tensor([float("-inf")])]) == 1


def test_first_nonfinite_tells_an_overflowing_sum_from_a_bad_entry():
    # float32 max is about 3.4e38: these sums overflow although every entry is finite.
    overflowing = torch.tensor([3e38, 3e38, -1.0])
    cancelling = torch.tensor([float("inf"), 1.0, float("-inf")])  # its sum is NaN
    assert first_nonfinite([overflowing, torch.ones(2)]) is None
    assert first_nonfinite([overflowing, cancelling]) == 1
    assert first_nonfinite([cancelling, overflowing]) == 0
    assert first_nonfinite([overflowing, torch.tensor([1.0, float("nan")]), cancelling]) == 1
    assert first_nonfinite([torch.arange(3), torch.tensor([float("inf")])]) == 1  # integers
    maxima = abs_maxima([torch.arange(-5, 3), torch.zeros(0), overflowing])
    assert maxima == pytest.approx([5.0, 0.0, 3e38], rel=1e-7)  # 3e38 rounded to float32


def test_first_nonfinite_reads_sparse_and_complex_gradients():
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, float("nan")], (4,))
    assert first_nonfinite([torch.ones(2), sparse]) == 1
    compressed = torch.tensor([[1.0, 0.0], [0.0, float("inf")]]).to_sparse_csr()
    assert first_nonfinite([compressed]) == 0
    assert first_nonfinite([torch.eye(2).to_sparse_csr(), torch.eye(2).to_sparse()]) is None
    complex_grad = torch.tensor([1 + 1j, complex(0.0, float("inf"))])
    assert first_nonfinite([complex_grad]) == 0
    assert first_nonfinite([torch.ones(3, dtype=torch.complex64)]) is None


@pytest.mark.parametrize("build", BUILDERS)
def test_ignore_checks_nothing_and_the_bad_value_reaches_the_weights(build):
    """nonfinite="ignore" is torch.optim's behaviour: the step runs, the tensor with the bad
    entry turns NaN or infinite, the others step as they would have, nothing is counted."""
    model, clean = _model(), _model()
    optimizer = build(model.parameters(), nonfinite="ignore")
    reference = build(clean.parameters(), nonfinite="ignore")
    _set_grads(model, 0, float("nan"))
    _set_grads(clean, 0)
    optimizer.step()
    reference.step()
    assert optimizer.skipped_steps == 0
    after, expected = _weights(model), _weights(clean)
    assert not torch.isfinite(after[2]).all()  # "2.weight" held the NaN
    for index in (0, 1, 3):  # elementwise updates: the other tensors do not see it
        torch.testing.assert_close(after[index], expected[index], rtol=0, atol=0)
