from __future__ import annotations

import io
import itertools
import math

import pytest
import torch

from convergent.constrained import (
    DescentConstraints,
    DualAscent,
    DualCadence,
    Multipliers,
    PrimalDualResult,
    ResilientRelaxation,
    SlackAverage,
    inverse_probability_losses,
    lagrangian,
    sample_layers,
)


def test_slacks_follow_the_definition_for_constant_sequence_and_schedule_alpha():
    losses = torch.tensor([1.0, 0.8, 0.9, 0.5])
    torch.testing.assert_close(
        DescentConstraints(3, alpha=0.1)(losses), torch.tensor([-0.1, 0.18, -0.31])
    )
    sequence = DescentConstraints(3, alpha=[0.0, 0.5, 0.2])(losses)
    torch.testing.assert_close(sequence, torch.tensor([-0.2, 0.5, -0.22]))
    schedule = DescentConstraints(3, alpha=lambda layer: 0.1 * (layer - 1))(losses)
    torch.testing.assert_close(schedule, torch.tensor([-0.2, 0.18, -0.22]))
    assert DescentConstraints(3).satisfied(losses).tolist() == [True, False, True]
    assert DescentConstraints(3).names == ["descent_1", "descent_2", "descent_3"]


def test_detach_previous_stops_gradients_through_the_right_hand_side():
    losses = torch.tensor([1.0, 0.8, 0.9], requires_grad=True)
    DescentConstraints(2, alpha=0.5)(losses).sum().backward()
    torch.testing.assert_close(losses.grad, torch.tensor([-0.5, 0.5, 1.0]))
    losses.grad = None
    DescentConstraints(2, alpha=0.5, detach_previous=True)(losses).sum().backward()
    torch.testing.assert_close(losses.grad, torch.tensor([0.0, 1.0, 1.0]))


def test_constraint_state_round_trips():
    source = DescentConstraints(3, alpha=[0.1, 0.2, 0.3])
    target = DescentConstraints(3)
    target.load_state_dict(source.state_dict())
    torch.testing.assert_close(target.alpha, source.alpha)
    target.set_alpha(0.05)
    torch.testing.assert_close(target.alpha, torch.full((3,), 0.05))


@pytest.mark.parametrize("alpha", [1.0, -0.1, 1.5])
def test_alpha_outside_the_unit_interval_is_rejected(alpha):
    with pytest.raises(ValueError, match=rf"alpha for layer 1 is {alpha}; it must be in \[0, 1\)"):
        DescentConstraints(2, alpha=alpha)


def test_bad_layer_losses_are_named():
    constraints = DescentConstraints(3)
    with pytest.raises(ValueError, match=r"shape \(3,\); expected \(4,\)"):
        constraints(torch.ones(3))
    with pytest.raises(FloatingPointError, match="loss at layer 2 is nan"):
        constraints(torch.tensor([1.0, 1.0, math.nan, 1.0]))
    with pytest.raises(FloatingPointError, match="loss at layer 0 is inf"):
        constraints(torch.tensor([math.inf, 1.0, 1.0, 1.0]))


def test_bad_dual_settings_are_rejected():
    with pytest.raises(ValueError, match=r"dual learning rate is -0.1; it must be >= 0"):
        DualAscent(2, lr=-0.1)
    with pytest.raises(ValueError, match=r"resilient cost c is 0.0; it must be > 0"):
        DualAscent(2, resilient_cost=0.0)
    with pytest.raises(ValueError, match=r"resilient cost c is -1.0"):
        ResilientRelaxation(2, cost=-1.0)
    with pytest.raises(ValueError, match=r"initial multiplier is -1\.0"):
        Multipliers(2, init=-1.0)
    with pytest.raises(ValueError, match=r"slack estimate has shape \(3,\); expected \(2,\)"):
        DualAscent(2).step(torch.zeros(3))
    with pytest.raises(FloatingPointError, match="slack of constraint 2 is nan"):
        DualAscent(2).step(torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match=r"dual interval is 0; it must be >= 1"):
        DualCadence("every", 0)
    with pytest.raises(ValueError, match="cadence must be one of"):
        DualCadence("sometimes")
    with pytest.raises(ValueError, match="2 slacks for 3 multipliers"):
        lagrangian(torch.tensor(1.0), torch.zeros(2), torch.zeros(3))


def test_dual_ascent_is_projected_sgd_ascent():
    dual = DualAscent(3, lr=0.5)
    dual.step(torch.tensor([1.0, -2.0, 0.2]))
    torch.testing.assert_close(dual.value(), torch.tensor([0.5, 0.0, 0.1]))
    dual.step(torch.tensor([-2.0, 1.0, 0.2]))
    torch.testing.assert_close(dual.value(), torch.tensor([0.0, 0.5, 0.2]))


def test_any_torch_optimizer_ascends_whichever_sign_convention_it_uses():
    slacks = [torch.tensor([0.3, -0.1]), torch.tensor([0.2, 0.4]), torch.tensor([-0.5, 0.1])]
    plain = DualAscent(2, optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    maximizing = DualAscent(
        2, optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, maximize=True)
    )
    adam = DualAscent(2, optimizer=lambda p: torch.optim.Adam(p, lr=0.1))
    for slack in slacks:
        plain.step(slack)
        maximizing.step(slack)
        adam.step(slack)
    torch.testing.assert_close(plain.value(), maximizing.value())
    assert float(plain.value()[0]) > 0 and float(adam.value()[0]) > 0
    assert bool((adam.value() >= 0).all())


def test_resilient_slack_is_lambda_over_c_in_closed_form_and_by_gradient_steps():
    lam = torch.tensor([0.0, 0.6, 2.0])
    closed = ResilientRelaxation(3, cost=4.0)
    closed.update_(lam)
    torch.testing.assert_close(closed.value, lam / 4.0)
    gradient = ResilientRelaxation(3, cost=4.0, update="gradient", lr=0.1)
    for _ in range(200):
        gradient.update_(lam)
    torch.testing.assert_close(gradient.value, lam / 4.0)
    assert float(closed.penalty()) == pytest.approx(0.5 * 4.0 * float((lam / 4.0).pow(2).sum()))


def test_resilient_dual_step_ascends_on_slack_minus_u():
    dual = DualAscent(1, lr=1.0, resilient_cost=2.0)
    dual.step(torch.tensor([1.0]))  # lambda = 1, u = 1/2
    torch.testing.assert_close(dual.value(), torch.tensor([1.0]))
    torch.testing.assert_close(dual.slack(), torch.tensor([0.5]))
    dual.step(torch.tensor([1.0]))  # lambda = 1 + (1 - 0.5) = 1.5, u = 0.75
    torch.testing.assert_close(dual.value(), torch.tensor([1.5]))
    torch.testing.assert_close(dual.slack(), torch.tensor([0.75]))


def test_lagrangian_value_and_primal_gradient():
    losses = torch.tensor([2.0, 1.5, 1.0], requires_grad=True)
    constraints = DescentConstraints(2, alpha=0.0)
    dual = DualAscent(2, lr=1.0, resilient_cost=2.0)
    dual.step(torch.tensor([1.0, 0.0]))  # lambda = (1, 0), u = (0.5, 0)
    slacks = constraints(losses)
    value = lagrangian(losses[-1], slacks, dual.value(), dual.relaxation)
    # 1.0 + 1 * (-0.5 - 0.5) + (2 / 2) * 0.25
    assert float(value.detach()) == pytest.approx(0.25)
    value.backward()
    torch.testing.assert_close(losses.grad, torch.tensor([-1.0, 1.0, 1.0]))


def test_dual_state_round_trip_reproduces_the_trajectory():
    def make():
        return DualAscent(2, optimizer=lambda p: torch.optim.Adam(p, lr=0.1), resilient_cost=3.0)

    first = make()
    slacks = [torch.tensor([0.3, -0.1]), torch.tensor([0.2, 0.4]), torch.tensor([0.5, 0.1])]
    first.step(slacks[0])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second = make()
    second.load_state_dict(torch.load(buffer, weights_only=True))
    for slack in slacks[1:]:
        first.step(slack)
        second.step(slack)
    torch.testing.assert_close(first.value(), second.value())
    torch.testing.assert_close(first.slack(), second.slack())


def test_cadence_and_running_average():
    assert [DualCadence("every", 3).is_due(s) for s in range(1, 7)] == [
        False,
        False,
        True,
        False,
        False,
        True,
    ]
    average = SlackAverage(2)
    average.add(torch.tensor([1.0, 2.0]))
    average.add(torch.tensor([3.0, -2.0]))
    torch.testing.assert_close(average.mean(), torch.tensor([2.0, 0.0]))
    average.reset()
    with pytest.raises(RuntimeError, match="no slack estimate"):
        average.mean()


def test_layer_sampling_is_unbiased_exactly():
    # Average the estimate over every possible draw: it must equal the true losses.
    num_layers, count = 4, 2
    losses = torch.tensor([3.0, 2.5, 1.0, 1.2, 0.7])
    draws = list(itertools.combinations(range(num_layers), count))
    total = torch.zeros(num_layers + 1)
    for drawn in draws:
        layers = [*drawn, num_layers]
        total += inverse_probability_losses(losses[layers], layers, num_layers, count)
    torch.testing.assert_close(total / len(draws), losses)
    layers = sample_layers(num_layers, count, torch.Generator().manual_seed(0))
    assert len(layers) == count + 1 and layers[-1] == num_layers
    with pytest.raises(ValueError, match=r"layers per step is 5; it must be in \[1, 4\]"):
        sample_layers(num_layers, 5, torch.Generator())


def test_result_flattens_to_named_floats():
    result = PrimalDualResult.from_tensors(
        torch.tensor([2.0, 1.0, 0.5]),
        torch.tensor([-1.0, -0.5]),
        torch.tensor([0.0, 0.25]),
        torch.tensor([0.0, 0.125]),
        torch.tensor(0.4),
    )
    metrics = result.metrics()
    assert metrics["objective"] == 0.5
    assert metrics["layer_loss_0"] == 2.0
    assert metrics["lambda_2"] == 0.25
    assert metrics["u_2"] == 0.125
    assert metrics["slack_1"] == -1.0
    assert metrics["lagrangian"] == pytest.approx(0.4)
