"""The dual side by hand: projected ascent, resilient slacks, cadence, averages, messages.

Every expected value is the module docstring's rule worked out here in plain Python:

    lambda <- [lambda + eta_d * (s_hat - u)]_+,   u = lambda / c  (closed form)
    u <- [u - eta_u * (c * u - lambda)]_+                         (gradient)
    L = f_L + sum_l lambda_l (s_l - u_l) + (c / 2) sum_l u_l^2
    s_l = f_l - (1 - alpha_l) f_{l-1}
"""

from __future__ import annotations

import math

import pytest
import torch

from convergent.constrained import (
    DescentConstraints,
    DualAscent,
    DualCadence,
    SlackAverage,
    descent_slacks,
    lagrangian,
    resolve_alpha,
)

F64 = torch.float64


def _positive(value: float) -> float:
    return max(value, 0.0)


class _PlainDescent(torch.optim.Optimizer):
    """theta <- theta - lr * grad, with no "maximize" option, no argument checks, and a plain
    int next to a tensor in its state."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state[param]
                state["steps"] = state.get("steps", 0) + 1
                state["last_grad"] = param.grad.clone()
                param.add_(param.grad, alpha=-group["lr"])


class _UnitStep(torch.optim.Optimizer):
    """theta <- theta - grad: an optimizer whose groups have no "lr" at all."""

    def __init__(self, params) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                param.sub_(param.grad)


SLACKS = [[0.4, -0.2, 0.1], [-0.6, 0.3, 0.1], [0.2, 0.2, -0.5], [-0.1, -0.1, 0.0]]


def test_hard_projected_ascent_follows_the_rule_step_by_step():
    dual = DualAscent(3, lr=0.5, init=0.1)
    lam = [0.1, 0.1, 0.1]
    for slack in SLACKS:
        dual.step(torch.tensor(slack))
        lam = [_positive(value + 0.5 * s) for value, s in zip(lam, slack, strict=True)]
        assert dual.value().tolist() == pytest.approx(lam, abs=1e-7)
    assert dual.slack() is None


def test_resilient_closed_form_ascends_on_slack_minus_lambda_over_c():
    cost, lr = 4.0, 0.5
    dual = DualAscent(3, lr=lr, init=0.2, resilient_cost=cost)
    lam = [0.2, 0.2, 0.2]
    u = [value / cost for value in lam]  # set at construction
    assert dual.slack().tolist() == pytest.approx(u)
    for slack in SLACKS:
        dual.step(torch.tensor(slack))
        lam = [_positive(value + lr * (s - w)) for value, s, w in zip(lam, slack, u, strict=True)]
        u = [value / cost for value in lam]
        assert dual.value().tolist() == pytest.approx(lam, abs=1e-7)
        assert dual.slack().tolist() == pytest.approx(u, abs=1e-7)


@pytest.mark.parametrize("slack_lr", [None, 0.5])
def test_resilient_gradient_slack_takes_projected_steps_toward_lambda_over_c(slack_lr):
    cost, lr = 4.0, 1.0
    options = {} if slack_lr is None else {"slack_lr": slack_lr}
    eta = 0.1 if slack_lr is None else slack_lr  # 0.1 is the documented default
    dual = DualAscent(2, lr=lr, resilient_cost=cost, slack_update="gradient", **options)
    lam, u = [0.0, 0.0], [0.0, 0.0]
    for slack in ([1.0, -0.5], [0.5, 0.25], [-2.0, 1.0]):
        dual.step(torch.tensor(slack))
        lam = [_positive(value + lr * (s - w)) for value, s, w in zip(lam, slack, u, strict=True)]
        u = [_positive(w - eta * (cost * w - value)) for w, value in zip(u, lam, strict=True)]
        assert dual.value().tolist() == pytest.approx(lam, abs=1e-6)
        assert dual.slack().tolist() == pytest.approx(u, abs=1e-6)


def test_defaults_are_a_zero_start_and_learning_rate_one_hundredth():
    dual = DualAscent(2)
    assert dual.value().tolist() == [0.0, 0.0]
    dual.step(torch.tensor([1.0, -1.0]))
    assert dual.value().tolist() == pytest.approx([0.01, 0.0])
    frozen = DualAscent(2, lr=0.0)  # lr = 0 is allowed: the multipliers stay put
    frozen.step(torch.tensor([1.0, 1.0]))
    assert frozen.value().tolist() == [0.0, 0.0]


def test_an_optimizer_without_maximize_or_lr_still_ascends():
    plain = DualAscent(2, optimizer=lambda params: _PlainDescent(params, lr=0.5))
    plain.step(torch.tensor([0.4, -0.4]))
    assert plain.value().tolist() == pytest.approx([0.2, 0.0])
    unit = DualAscent(2, optimizer=_UnitStep)
    unit.step(torch.tensor([0.3, -0.3]))
    assert unit.value().tolist() == pytest.approx([0.3, 0.0])


def test_a_float64_slack_estimate_moves_float32_multipliers():
    dual = DualAscent(2, lr=0.5)
    dual.step(torch.tensor([0.2, -0.4], dtype=F64))
    assert dual.value().dtype == torch.float32
    assert dual.value().tolist() == pytest.approx([0.1, 0.0])


def test_cadence_runs_the_dual_step_every_k_steps_on_the_running_average():
    cadence, average = DualCadence("every", 3), SlackAverage(2)
    dual = DualAscent(2, lr=1.0)
    estimates = [[0.3, -0.9], [0.6, 0.3], [-0.3, 0.3], [0.9, 0.0], [0.0, 0.0], [0.3, -0.6]]
    lam, seen, history = [0.0, 0.0], [], []
    for step, estimate in enumerate(estimates, start=1):
        average.add(torch.tensor(estimate))
        seen.append(estimate)
        if cadence.is_due(step):
            dual.step(average.mean())
            average.reset()
            means = [sum(column) / len(seen) for column in zip(*seen, strict=True)]
            lam = [_positive(value + mean) for value, mean in zip(lam, means, strict=True)]
            seen = []
        history.append(dual.value().tolist())
    assert history[0] == history[1] == [0.0, 0.0]  # no dual step before step 3
    assert history[2] == pytest.approx([0.2, 0.0]) and history[3] == history[4] == history[2]
    assert history[5] == pytest.approx(lam)
    assert lam == pytest.approx([0.6, 0.0])


def test_the_running_average_sums_in_float64_and_returns_float32():
    average = SlackAverage(1)
    for value in (1e8, 1.0, -1e8):  # float32 would lose the 1 next to 1e8
        average.add(torch.tensor([value]))
    mean = average.mean()
    assert mean.dtype == torch.float32 and float(mean[0]) == pytest.approx(1 / 3)
    average.reset()
    with pytest.raises(RuntimeError, match=r"^no slack estimate was recorded since the last "
                                           r"dual step$"):  # fmt: skip
        average.mean()


def test_lagrangian_matches_the_formula_and_keeps_the_slacks_dtype():
    losses = torch.tensor([3.0, 2.0, 1.9, 0.7], dtype=F64, requires_grad=True)
    slacks = descent_slacks(losses, torch.tensor([0.1, 0.2, 0.0], dtype=F64))
    dual = DualAscent(3, lr=1.0, resilient_cost=2.0)
    dual.step(torch.tensor([0.5, 0.0, 1.0]))  # lambda = (0.5, 0, 1), u = lambda / 2
    lam, u = [0.5, 0.0, 1.0], [0.25, 0.0, 0.5]
    value = lagrangian(losses[-1], slacks, dual.value(), dual.relaxation)
    s = [2.0 - 0.9 * 3.0, 1.9 - 0.8 * 2.0, 0.7 - 1.0 * 1.9]
    want = 0.7 + sum(a * (b - c) for a, b, c in zip(lam, s, u, strict=True))
    want += 0.5 * 2.0 * sum(w * w for w in u)
    assert float(value.detach()) == pytest.approx(want, rel=1e-6)
    hard = lagrangian(losses[-1], slacks, dual.value())
    assert float(hard.detach()) == pytest.approx(
        0.7 + sum(a * b for a, b in zip(lam, s, strict=True)), rel=1e-6
    )
    dual_grad = dual.multipliers.weight.grad.clone()
    value.backward()  # d/d f: only through the slacks, weighted by lambda
    want_grad = [-0.9 * 0.5, 0.5 - 0.8 * 0.0, 0.0 - 1.0 * 1.0, 1.0 + 1.0]
    assert losses.grad.tolist() == pytest.approx(want_grad)
    assert torch.equal(dual.multipliers.weight.grad, dual_grad)  # lambda is a constant here

    half = lagrangian(torch.tensor(0.7, dtype=torch.bfloat16), slacks.detach().bfloat16(),
                      dual.value(), dual.relaxation)  # fmt: skip
    assert half.dtype == torch.bfloat16  # multipliers, u and the penalty follow the slacks


def test_dual_to_moves_multipliers_slacks_and_optimizer_tensors():
    dual = DualAscent(2, optimizer=lambda params: torch.optim.Adam(params, lr=0.1),
                      resilient_cost=2.0)  # fmt: skip
    dual.step(torch.tensor([0.5, -0.5]))
    assert dual.to(F64) is dual
    assert dual.value().dtype == F64 and dual.slack().dtype == F64
    state = next(iter(dual.optimizer.state.values()))
    assert state["exp_avg"].dtype == F64 and state["exp_avg_sq"].dtype == F64
    assert state["step"].dtype == torch.float32  # a scalar counter stays where torch keeps it
    dual.step(torch.tensor([0.5, -0.5], dtype=F64))
    assert dual.value().dtype == F64

    plain = DualAscent(2, optimizer=lambda params: _PlainDescent(params, lr=0.5))
    plain.step(torch.tensor([0.4, -0.4]))
    plain.to(F64)
    state = next(iter(plain.optimizer.state.values()))
    assert state["steps"] == 1 and state["last_grad"].dtype == F64
    hard = DualAscent(2).to(F64)
    assert hard.value().dtype == F64 and hard.slack() is None


def test_dual_messages_name_the_value():
    with pytest.raises(ValueError, match=r"^the dual learning rate is -0\.1; it must be >= 0$"):
        DualAscent(2, lr=-0.1)
    with pytest.raises(ValueError, match=r"^the dual learning rate is -0\.5; it must be >= 0$"):
        DualAscent(2, optimizer=lambda params: _PlainDescent(params, lr=-0.5))
    with pytest.raises(ValueError, match=r"^slack estimate has shape \(3,\); expected \(2,\), "
                                         r"one per constraint$"):  # fmt: skip
        DualAscent(2).step(torch.zeros(3))
    with pytest.raises(FloatingPointError, match=r"^the slack of constraint 2 is -inf; slack "
                                                 r"estimates must be finite$"):  # fmt: skip
        DualAscent(3).step(torch.tensor([0.0, -math.inf, math.nan]))
    resilient = DualAscent(2, resilient_cost=1.0)
    with pytest.raises(ValueError, match=r"^the saved dual state has no resilient slacks to "
                                         r"restore$"):  # fmt: skip
        resilient.load_state_dict(DualAscent(2).state_dict())
    with pytest.raises(ValueError, match=r"^0 slacks for 1 multipliers; they must match$"):
        lagrangian(torch.tensor(1.0), torch.tensor(0.5), torch.zeros(1))
    with pytest.raises(ValueError, match=r"^2 slacks for 3 multipliers; they must match$"):
        lagrangian(torch.tensor(1.0), torch.zeros(2), torch.zeros(3))


def test_cadence_accepts_intervals_and_names_bad_ones():
    assert DualCadence().interval == 1 and DualCadence("every", 1).is_due(1)
    assert DualCadence("epoch", 5).is_due(10)
    with pytest.raises(ValueError, match=r"^cadence must be one of step, every, epoch, got 'x'$"):
        DualCadence("x")
    for interval in (1.5, True):
        with pytest.raises(ValueError, match=rf"^the dual interval must be an integer, got "
                                             rf"{interval!r}$"):  # fmt: skip
            DualCadence("every", interval)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^the dual interval is 0; it must be >= 1$"):
        DualCadence("every", 0)
    with pytest.raises(ValueError, match=r"^cadence 'step' updates every step; got interval 2 "
                                         r"\(use cadence 'every' for K > 1\)$"):  # fmt: skip
        DualCadence("step", 2)


def test_descent_slacks_follow_the_definition_with_and_without_detaching():
    losses = torch.tensor([2.0, 1.5, 1.4, 0.9], dtype=F64, requires_grad=True)
    alpha = torch.tensor([0.1, 0.3, 0.5], dtype=F64)
    want = [1.5 - 0.9 * 2.0, 1.4 - 0.7 * 1.5, 0.9 - 0.5 * 1.4]
    for detach in (False, True):
        slacks = descent_slacks(losses, alpha, detach_previous=detach)
        assert slacks.tolist() == pytest.approx(want)
    slacks = descent_slacks(losses, alpha)  # by default the gradient reaches f_{l-1} too
    slacks.sum().backward()
    assert losses.grad.tolist() == pytest.approx([-0.9, 1 - 0.7, 1 - 0.5, 1.0])
    single = descent_slacks(torch.tensor([1.0, 0.5], requires_grad=True), resolve_alpha(0.1, 1))
    assert single.dtype == torch.float32  # float64 alpha follows float32 losses
    assert single.tolist() == pytest.approx([0.5 - 0.9])


def test_satisfied_includes_a_slack_of_exactly_zero():
    losses = torch.tensor([1.0, 1.0, 0.5, 0.75])  # alpha = 0: slacks 0, -0.5, 0.25
    assert DescentConstraints(3).satisfied(losses).tolist() == [True, True, False]


def test_alpha_resolution_and_layer_loss_messages():
    assert resolve_alpha(0.25, 1).tolist() == [0.25] and resolve_alpha(0.25, 1).dtype == F64
    assert DescentConstraints(1, alpha=0.5)(torch.tensor([1.0, 0.4])).tolist() == [
        pytest.approx(-0.1)
    ]
    with pytest.raises(ValueError, match=r"^num_constraints must be a positive integer, got 0$"):
        resolve_alpha(0.1, 0)
    with pytest.raises(ValueError, match=r"^alpha has 2 values; expected one per constraint "
                                         r"\(3\)$"):  # fmt: skip
        resolve_alpha([0.1, 0.2], 3)
    constraints = DescentConstraints(3)
    with pytest.raises(ValueError, match=r"^per-layer losses have shape \(4, 1\); expected "
                                         r"\(4,\) \(f_0 \.\. f_L for 3 constraints\)$"):  # fmt: skip
        constraints(torch.ones(4, 1))
    with pytest.raises(FloatingPointError, match=r"^the loss at layer 2 is nan; per-layer "
                                                 r"losses must be finite$"):  # fmt: skip
        constraints(torch.tensor([1.0, 1.0, math.nan, 1.0]))
