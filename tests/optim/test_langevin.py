from __future__ import annotations

import io
import math

import pytest
import torch

from convergent.optim.langevin import (
    Langevin,
    NoiseSchedule,
    langevin_update,
    s_from_temperature,
    temperature_from_s,
)
from convergent.train import fit
from tests.conftest import TinyClassifier, make_classification


def _model(seed: int = 0, dtype: torch.dtype = torch.float32) -> TinyClassifier:
    torch.manual_seed(seed)
    return TinyClassifier(dropout=0.0).to(dtype)


def _run(model, optimizer, steps: int, seed: int = 0) -> None:
    data = make_classification(n=64, seed=seed)
    inputs, labels = (
        data.tensors["inputs"].to(next(model.parameters()).dtype),
        data.tensors["labels"],
    )
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs).logits, labels)
        loss.backward()
        optimizer.step()


def _same(first, second) -> bool:
    return all(
        torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(), strict=True)
    )


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_s_zero_is_sgd_bit_for_bit(implementation):
    ours, theirs = _model(), _model()
    _run(ours, Langevin(ours.parameters(), lr=0.1, s=0.0, implementation=implementation), 7)
    _run(theirs, torch.optim.SGD(theirs.parameters(), lr=0.1), 7)
    assert _same(ours, theirs)
    assert not _same(ours, _model())  # the parameters did move


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_s_zero_preconditioned_is_rmsprop_bit_for_bit(implementation):
    ours, theirs = _model(), _model()
    optimizer = Langevin(ours.parameters(), lr=1e-2, s=0.0, preconditioned=True, alpha=0.9,
                         eps=1e-6, implementation=implementation)  # fmt: skip
    _run(ours, optimizer, 7)
    _run(theirs, torch.optim.RMSprop(theirs.parameters(), lr=1e-2, alpha=0.9, eps=1e-6), 7)
    assert _same(ours, theirs)


@pytest.mark.parametrize("preconditioned", [False, True])
def test_reference_and_foreach_agree_with_noise(preconditioned):
    first, second = _model(dtype=torch.float64), _model(dtype=torch.float64)
    options = {"lr": 1e-2, "s": 0.5, "preconditioned": preconditioned, "seed": 3}
    _run(first, Langevin(first.parameters(), implementation="reference", **options), 5)
    _run(second, Langevin(second.parameters(), implementation="foreach", **options), 5)
    assert _same(first, second)
    assert not _same(first, _model(dtype=torch.float64))


def test_update_function_matches_the_rule():
    generator = torch.Generator().manual_seed(0)
    param, grad, noise = (
        torch.randn(5, 4, generator=generator, dtype=torch.float64) for _ in range(3)
    )
    expected = param - 0.1 * grad + math.sqrt(0.1 * 2.0) * noise
    torch.testing.assert_close(langevin_update(param, grad, noise, 0.1, 2.0), expected)
    denominator = torch.rand(5, 4, generator=generator, dtype=torch.float64) + 0.5
    expected = param - 0.1 * grad / denominator + torch.sqrt(0.1 * 2.0 / denominator) * noise
    torch.testing.assert_close(langevin_update(param, grad, noise, 0.1, 2.0, denominator), expected)


def test_noise_has_variance_lr_times_s():
    param = torch.nn.Parameter(torch.zeros(200_000, dtype=torch.float64))
    optimizer = Langevin([param], lr=0.01, s=3.0, seed=0)
    param.grad = torch.zeros_like(param)
    optimizer.step()
    assert abs(float(param.detach().mean())) < 5 * math.sqrt(0.03 / 200_000)
    assert float(param.detach().var()) == pytest.approx(0.03, rel=0.02)


def test_seed_fixes_the_noise_and_generators_are_independent():
    runs = []
    for seed in (1, 1, 2):
        model = _model()
        _run(model, Langevin(model.parameters(), lr=1e-2, s=1.0, seed=seed), 3)
        runs.append(model)
    assert _same(runs[0], runs[1])
    assert not _same(runs[0], runs[2])


def test_explicit_generator_is_used_and_saved():
    model = _model()
    generator = torch.Generator().manual_seed(5)
    optimizer = Langevin(model.parameters(), lr=1e-2, s=1.0, generator=generator)
    before = generator.get_state().clone()
    _run(model, optimizer, 1)
    assert not torch.equal(before, generator.get_state())
    assert torch.equal(optimizer.state_dict()["noise"]["generators"]["cpu"], generator.get_state())


@pytest.mark.parametrize("preconditioned", [False, True])
def test_state_dict_round_trip_reproduces_the_trajectory(preconditioned):
    straight = _model()
    options = {"lr": 1e-2, "s": 0.3, "preconditioned": preconditioned, "seed": 11}
    _run(straight, Langevin(straight.parameters(), **options), 8)

    split = _model()
    optimizer = Langevin(split.parameters(), **options)
    _run(split, optimizer, 4)
    buffer = io.BytesIO()
    torch.save({"model": split.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed = _model(seed=99)  # different weights and a fresh generator, then restored
    resumed.load_state_dict(saved["model"])
    resumed_optimizer = Langevin(resumed.parameters(), lr=1.0, s=9.0, seed=0,
                                 preconditioned=preconditioned)  # fmt: skip
    resumed_optimizer.load_state_dict(saved["optimizer"])
    assert resumed_optimizer.param_groups[0]["s"] == 0.3
    _run(resumed, resumed_optimizer, 4)
    assert _same(straight, resumed)


def _fit_langevin(run_dir, max_steps, resume=False, checkpoint_every=0):
    model = _model()
    optimizer = Langevin(model.parameters(), lr=0.05, s=0.01, seed=4)
    schedule = NoiseSchedule(optimizer, lambda step: 1.0 / (1 + step))
    fit(model, optimizer, make_classification(), max_steps=max_steps, batch_size=16,
        run_dir=run_dir, checkpoint_every=checkpoint_every, resume=resume, progress=False,
        tensorboard=False, callbacks=[schedule])  # fmt: skip
    return model, optimizer


def test_works_in_fit_and_resumes_exactly(tmp_path):
    straight, optimizer = _fit_langevin(tmp_path / "straight", 8)
    assert optimizer.param_groups[0]["s"] == pytest.approx(0.01 / 9)
    _fit_langevin(tmp_path / "split", 4, checkpoint_every=4)
    resumed, _ = _fit_langevin(tmp_path / "split", 8, resume=True)
    assert _same(straight, resumed)


def test_noise_schedule_sets_s_per_group():
    first, second = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    optimizer = Langevin([{"params": [first], "s": 2.0}, {"params": [second], "s": 0.5}], lr=0.1)
    schedule = NoiseSchedule(optimizer, lambda step: 0.5**step)
    schedule.step()
    schedule.step()
    assert [group["s"] for group in optimizer.param_groups] == [0.5, 0.125]
    restored = NoiseSchedule(optimizer, lambda step: 0.5**step)
    restored.load_state_dict(schedule.state_dict())
    assert restored.last_step == 2 and optimizer.param_groups[0]["s"] == 0.5


def test_temperature_conversion():
    assert s_from_temperature(1.0) == 2.0
    assert temperature_from_s(0.5) == 0.25


@pytest.mark.parametrize(
    ("options", "message"),
    [({"lr": -0.1}, "lr must be a finite number >= 0, got -0.1"),
     ({"s": -1.0}, "s must be a finite number >= 0, got -1.0"),
     ({"alpha": 1.0}, "alpha must be in \\[0, 1\\), got 1.0"),
     ({"seed": -3}, "seed must be an integer >= 0 or None, got -3"),
     ({"implementation": "fast"}, "implementation must be one of")],
)  # fmt: skip
def test_bad_input_names_the_value(options, message):
    with pytest.raises(ValueError, match=message):
        Langevin([torch.nn.Parameter(torch.zeros(1))], **options)


def test_negative_s_in_a_group_is_rejected():
    with pytest.raises(ValueError, match="s must be a finite number >= 0, got -2"):
        Langevin([{"params": [torch.nn.Parameter(torch.zeros(1))], "s": -2}])
