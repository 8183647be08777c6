"""Langevin's bookkeeping: noise draws, generators, scratch buffers, schedules, bad input.

The expected values are written here: the update rule of the module docstring with the noise
drawn from `torch.Generator().manual_seed(seed)` (one draw per tensor, in parameter order),
torch.optim.SGD and RMSprop for the defaults, and the temperature and schedule formulas.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

from convergent.optim import langevin as langevin_module
from convergent.optim.langevin import (
    Langevin,
    NoiseSchedule,
    langevin_update,
    s_from_temperature,
    temperature_from_s,
)

CPU = torch.device("cpu")
SEED = 1234
# The documented seeding: the first generator is seeded with `seed`; each later one with
# `seed + 7919 * (generators created before it)`, plus 104729 * (rank + 1) for a shard stream.
DEVICE_OFFSET, SHARD_OFFSET = 7919, 104729

# Shapes chosen so that the scratch buffer is reused: two tensors of one shape, a smaller one
# after a larger one of the same dtype, and a float64 tensor smaller than the float32 ones.
SHAPES_AND_DTYPES = [
    ((5, 4), torch.float32),
    ((5, 4), torch.float32),
    ((3,), torch.float64),
    ((7,), torch.float32),
    ((2, 2), torch.float64),
]


def _params_and_grads(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    params = [
        torch.randn(shape, generator=generator, dtype=dtype).requires_grad_()
        for shape, dtype in SHAPES_AND_DTYPES
    ]
    grads = [
        [torch.randn(shape, generator=generator, dtype=dtype) for shape, dtype in SHAPES_AND_DTYPES]
        for _ in range(3)
    ]
    return params, grads


def _expected_plain(params, grads_per_step, lr, s_per_step, seed=SEED):
    """T <- T - lr * g + sqrt(lr * s) * xi, xi drawn per tensor in order from one generator."""
    generator = torch.Generator().manual_seed(seed)
    thetas = [param.detach().clone() for param in params]
    for grads, s in zip(grads_per_step, s_per_step, strict=True):
        for index, (theta, grad) in enumerate(zip(thetas, grads, strict=True)):
            theta = theta - lr * grad
            if s > 0:
                noise = torch.randn(theta.shape, generator=generator, dtype=theta.dtype)
                theta = theta + math.sqrt(lr * s) * noise
            thetas[index] = theta
    return thetas


def _assert_close(have, want):
    """float64 to round-off (so a float32 noise draw shows), float32 to its own precision."""
    tolerance = 1e-12 if have.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(have, want, rtol=tolerance, atol=tolerance)


def _run(optimizer, params, grads_per_step, s_per_step=None):
    for step, grads in enumerate(grads_per_step):
        if s_per_step is not None:
            for group in optimizer.param_groups:
                group["s"] = s_per_step[step]
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad.clone()
        optimizer.step()
    return [param.detach().clone() for param in params]


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_steps_follow_the_rule_with_fresh_noise_per_tensor_and_step(implementation):
    params, grads = _params_and_grads()
    start = [param.detach().clone() for param in params]
    lr, s = 0.05, 0.8
    optimizer = Langevin(params, lr=lr, s=s, seed=SEED, implementation=implementation)
    got = _run(optimizer, params, grads[:1])
    expected = _expected_plain(start, grads[:1], lr, [s])
    for have, want in zip(got, expected, strict=True):
        _assert_close(have, want)
    # The noise itself: what is left after the gradient step, over sqrt(lr * s).
    first = [
        (g - (x - lr * d)) / math.sqrt(lr * s) for g, x, d in zip(got, start, grads[0], strict=True)
    ]
    assert not torch.allclose(first[0], first[1])  # two tensors of one shape: two draws
    got_two = _run(optimizer, params, grads[1:2])
    second = [
        (g - (x - lr * d)) / math.sqrt(lr * s)
        for g, x, d in zip(got_two, got, grads[1], strict=True)
    ]
    for one, two in zip(first, second, strict=True):
        assert not torch.allclose(one, two, atol=1e-3)  # step t + 1 draws anew
    expected = _expected_plain(start, grads[:2], lr, [s, s])
    for have, want in zip(got_two, expected, strict=True):
        _assert_close(have, want)


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_preconditioned_first_step_follows_the_rule(implementation):
    params, grads = _params_and_grads(seed=1)
    start = [param.detach().clone() for param in params]
    lr, s, alpha, eps = 0.01, 0.5, 0.9, 1e-3
    optimizer = Langevin(params, lr=lr, s=s, preconditioned=True, alpha=alpha, eps=eps,
                         seed=SEED, implementation=implementation)  # fmt: skip
    got = _run(optimizer, params, grads[:1])
    generator = torch.Generator().manual_seed(SEED)
    for have, theta, grad in zip(got, start, grads[0], strict=True):
        # v = (1 - alpha) g^2 after one step from v = 0; D = sqrt(v) + eps; G = 1 / D.
        denominator = ((1 - alpha) * grad**2).sqrt() + eps
        noise = torch.randn(theta.shape, generator=generator, dtype=theta.dtype)
        want = theta - lr * grad / denominator + math.sqrt(lr * s) * noise / denominator.sqrt()
        _assert_close(have, want)


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_s_zero_draws_no_noise_so_later_noise_is_the_first_draw(implementation):
    params, grads = _params_and_grads(seed=2)
    start = [param.detach().clone() for param in params]
    optimizer = Langevin(params, lr=0.02, s=0.0, seed=SEED, implementation=implementation)
    got = _run(optimizer, params, grads, s_per_step=[0.0, 0.0, 1.0])
    expected = _expected_plain(start, grads, 0.02, [0.0, 0.0, 1.0])
    for have, want in zip(got, expected, strict=True):
        _assert_close(have, want)


def test_defaults_are_sgd_and_rmsprop_defaults():
    params, grads = _params_and_grads(seed=3)
    twins = [param.detach().clone().requires_grad_() for param in params]
    optimizer = Langevin(params)  # lr 1e-3, s 0, not preconditioned
    assert optimizer.implementation == "foreach"
    assert optimizer.nonfinite == "raise" and optimizer.skipped_steps == 0
    got = _run(optimizer, params, grads)
    want = _run(torch.optim.SGD(twins, lr=1e-3), twins, grads)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # Preconditioned: torch.optim.RMSprop's defaults alpha = 0.99 and eps = 1e-8.
    twins = [param.detach().clone().requires_grad_() for param in params]
    optimizer = Langevin(params, lr=0.01, preconditioned=True)
    rmsprop = torch.optim.RMSprop(twins, lr=0.01)
    got = _run(optimizer, params, grads)
    want = _run(rmsprop, twins, grads)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # The state has RMSprop's layout and step count, so the checkpoints are interchangeable.
    for param, twin in zip(params, twins, strict=True):
        ours, theirs = optimizer.state[param], rmsprop.state[twin]
        assert set(ours) == set(theirs) == {"step", "square_avg"}
        assert float(ours["step"]) == float(theirs["step"]) == 3.0
        assert torch.equal(ours["square_avg"], theirs["square_avg"])


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
def test_the_implementation_is_kept_and_only_foreach_keeps_scratch_buffers(
    implementation, monkeypatch
):
    # Proof of the path: "reference" steps one tensor at a time through langevin_update.
    calls = []

    def counting_update(*args, **kwargs):
        calls.append(1)
        return langevin_update(*args, **kwargs)

    monkeypatch.setattr(langevin_module, "langevin_update", counting_update)
    params, grads = _params_and_grads(seed=4)
    preconditioned = Langevin(params, lr=0.01, s=0.5, preconditioned=True, seed=SEED,
                              implementation=implementation)  # fmt: skip
    _run(preconditioned, params, grads[:1])
    assert len(calls) == (len(params) if implementation == "reference" else 0)
    optimizer = Langevin(params, lr=0.01, s=0.5, seed=SEED, implementation=implementation)
    assert optimizer.implementation == implementation
    _run(optimizer, params, grads[:1])
    # documented: one per (device, dtype), as large as the largest block of consecutive
    # tensors of that device and dtype (here 20 + 20 float32, then 3 and 4 float64 apart)
    buffers = optimizer._scratch_buffers
    first = {key: buffer.data_ptr() for key, buffer in buffers.items()}
    _run(optimizer, params, grads[1:])
    if implementation == "reference":
        assert buffers == {}
        return
    assert {key: buffer.data_ptr() for key, buffer in buffers.items()} == first  # no reallocation
    assert {key: buffer.numel() for key, buffer in buffers.items()} == {
        (CPU, torch.float32): 40,
        (CPU, torch.float64): 4,
    }
    assert all(buffer.dtype == key[1] for key, buffer in buffers.items())


def test_the_default_seed_comes_from_torchs_global_generator():
    def seed_after(global_seed):
        torch.manual_seed(global_seed)
        return Langevin([torch.zeros(1, requires_grad=True)]).seed

    seeds = [seed_after(global_seed) for global_seed in range(8)]
    assert seeds[3] == seed_after(3)  # equal on every DDP rank seeded alike
    assert len(set(seeds)) == 8 and min(seeds) >= 0
    assert max(seeds) > 2**40  # drawn from [0, 2**62), not a small range


def test_explicit_seeds_are_validated_and_zero_is_allowed():
    param = torch.zeros(1, requires_grad=True)
    assert Langevin([param], seed=0).seed == 0
    for seed in (True, 1.5, -1):
        with pytest.raises(
            ValueError, match=rf"^seed must be an integer >= 0 or None, got {seed!r}"
        ):
            Langevin([param], seed=seed)
    with pytest.raises(TypeError, match=r"^generator must be a torch\.Generator, got str\."):
        Langevin([param], generator="cpu")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"^implementation must be one of \('reference', 'foreach'\), got 'fast'\.$",
    ):
        Langevin([param], implementation="fast")  # type: ignore[arg-type]


def test_generators_are_keyed_by_device_and_seeded_from_the_seed():
    explicit = torch.Generator().manual_seed(5)
    optimizer = Langevin([torch.zeros(2, requires_grad=True)], seed=SEED, generator=explicit)
    assert optimizer.generator_for(CPU) is explicit
    assert optimizer.generator_for(torch.device("cpu")) is explicit  # found again, not re-made

    fresh = Langevin([torch.zeros(2, requires_grad=True)], seed=SEED)
    replicated = fresh.generator_for(CPU)
    assert torch.equal(replicated.get_state(), torch.Generator().manual_seed(SEED).get_state())
    shard = fresh.generator_for(CPU, shard=True)  # one process: rank 0
    assert shard is not replicated and fresh.generator_for(CPU, shard=True) is shard
    want = torch.Generator().manual_seed(SEED + DEVICE_OFFSET + SHARD_OFFSET * (0 + 1))
    assert torch.equal(shard.get_state(), want.get_state())
    assert list(fresh.state_dict()["noise"]["generators"]) == ["cpu", "cpu#shard-of-rank-0"]


def test_device_keys_name_the_current_accelerator(monkeypatch):
    # An accelerator without an index is its current device, so "cuda" and "cuda:3" share one
    # generator (and one checkpoint entry); torch types without a module keep their name.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.xpu, "current_device", lambda: 2)
    device_key = langevin_module.device_key
    assert device_key("cpu") == "cpu" and device_key(CPU) == "cpu"
    assert device_key("cuda") == "cuda:3" and device_key(torch.device("cuda")) == "cuda:3"
    assert device_key("cuda:1") == "cuda:1"
    assert device_key("xpu") == "xpu:2"
    assert device_key("meta") == "meta"  # torch has no `meta` module
    assert not hasattr(torch.mps, "current_device")
    assert device_key("mps") == "mps"  # a module without current_device


def _checkpoint(optimizer) -> dict:
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("preconditioned", [False, True])
def test_round_trip_mid_run_restores_seed_and_every_generator(preconditioned):
    params, grads = _params_and_grads(seed=5)
    twins = [param.detach().clone().requires_grad_() for param in params]
    options = {"lr": 0.01, "s": 0.4, "preconditioned": preconditioned, "nonfinite": "skip"}
    straight = Langevin(params, seed=SEED, **options)
    _run(straight, params, grads[:1])
    _run(straight, params, [[torch.full_like(grad, math.nan) for grad in grads[0]]])  # skipped
    straight.generator_for(CPU, shard=True).seed()  # a shard stream in an unseeded state
    saved = _checkpoint(straight)
    shard_state = straight.generator_for(CPU, shard=True).get_state()

    _run(Langevin(twins, seed=SEED, **options), twins, grads[:1])
    resumed = Langevin(twins, seed=99, **options)
    resumed.load_state_dict(saved)
    assert resumed.seed == SEED and resumed.skipped_steps == 1
    assert torch.equal(resumed.generator_for(CPU, shard=True).get_state(), shard_state)
    want = _run(straight, params, grads[1:])
    got = _run(resumed, twins, grads[1:])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_load_skips_other_ranks_shard_streams_and_accepts_plain_checkpoints():
    source = Langevin([torch.zeros(3, requires_grad=True)], seed=SEED)
    replicated = source.generator_for(CPU)
    replicated.seed()
    saved = source.state_dict()
    other_rank = torch.Generator().manual_seed(77).get_state()
    # Another rank's stream first: it must be skipped, not end the restore.
    saved["noise"]["generators"] = {
        "cpu#shard-of-rank-1": other_rank,
        **saved["noise"]["generators"],
    }
    target = Langevin([torch.zeros(3, requires_grad=True)], seed=0)
    target.load_state_dict(saved)
    assert torch.equal(target.generator_for(CPU).get_state(), replicated.get_state())
    assert list(target.state_dict()["noise"]["generators"]) == ["cpu"]

    # A checkpoint of a plain optimizer has no noise entry: the groups load, the seed stays.
    param = torch.zeros(3, requires_grad=True)
    plain = torch.optim.SGD([param], lr=0.3)
    langevin = Langevin([param], lr=0.1, s=0.2, seed=SEED)
    state = plain.state_dict()
    state["param_groups"][0].update({"s": 0.2, "preconditioned": False, "alpha": 0.99, "eps": 0.0})
    langevin.load_state_dict(state)
    assert langevin.param_groups[0]["lr"] == 0.3 and langevin.seed == SEED
    assert langevin.skipped_steps == 0


def test_temperature_conversions_are_s_equals_two_temperatures():
    for temperature in (0.0, 0.3, 1.0, 2.5):
        assert s_from_temperature(temperature) == pytest.approx(2 * temperature)
        assert temperature_from_s(2 * temperature) == pytest.approx(temperature)
    with pytest.raises(ValueError, match=r"^temperature must be a finite number >= 0, got -1\.0"):
        s_from_temperature(-1.0)
    with pytest.raises(ValueError, match=r"^s must be a finite number >= 0, got -0\.5"):
        temperature_from_s(-0.5)


def test_update_function_adds_noise_at_s_one_and_requires_it():
    generator = torch.Generator().manual_seed(0)
    param, grad, noise = (torch.randn(6, generator=generator, dtype=torch.float64) for _ in "abc")
    expected = param - 0.1 * grad + math.sqrt(0.1 * 1.0) * noise
    torch.testing.assert_close(langevin_update(param, grad, noise, 0.1, 1.0), expected)
    with pytest.raises(
        ValueError, match=r"^noise is required when s > 0, got s=0\.5 and noise=None"
    ):
        langevin_update(param, grad, None, 0.1, 0.5)


def test_noise_schedule_is_initial_s_times_the_factor():
    first, second = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    optimizer = Langevin([{"params": [first], "s": 2.0}, {"params": [second], "s": 0.5}], lr=0.1)

    def factor(step):
        return 1.0 / (1.0 + 0.5 * step)

    schedule = NoiseSchedule(optimizer, factor)
    assert [group["s"] for group in optimizer.param_groups] == [2.0, 0.5]  # factor(0) = 1
    for step in (1, 2, 3):
        schedule.step()
        want = [2.0 * factor(step), 0.5 * factor(step)]
        assert [group["s"] for group in optimizer.param_groups] == pytest.approx(want)
    schedule.on_step_end(7, {})
    assert optimizer.param_groups[1]["s"] == pytest.approx(0.5 * factor(7))
    restored = NoiseSchedule(optimizer, factor)  # built now, it takes the current s as initial
    restored.load_state_dict(schedule.state_dict())
    assert restored.initial_s == [2.0, 0.5] and restored.last_step == 7
    assert optimizer.param_groups[0]["s"] == pytest.approx(2.0 * factor(7))


def test_noise_schedule_errors_name_the_group_and_the_step():
    param = torch.zeros(1, requires_grad=True)
    with pytest.raises(
        ValueError, match=r"^param group 0 has no 's'; NoiseSchedule needs Langevin"
    ):
        NoiseSchedule(torch.optim.SGD([param], lr=0.1), lambda step: 1.0)
    optimizer = Langevin([{"params": [param]}, {"params": [torch.zeros(1, requires_grad=True)]}])
    del optimizer.param_groups[1]["s"]
    with pytest.raises(ValueError, match=r"^param group 1 has no 's'"):
        NoiseSchedule(optimizer, lambda step: 1.0)

    schedule = NoiseSchedule(Langevin([param], s=1.0), lambda step: 1.0 - 0.5 * step)
    schedule.step()
    schedule.step()
    with pytest.raises(ValueError, match=r"^factor\(3\) must be a finite number >= 0, got -0\.5"):
        schedule.step()

    # A group added after the schedule was built has no initial s: an error, not skipped.
    optimizer = Langevin([param], s=1.0)
    schedule = NoiseSchedule(optimizer, lambda step: 0.5)
    optimizer.add_param_group({"params": [torch.zeros(1, requires_grad=True)]})
    with pytest.raises(ValueError):
        schedule.step()


def test_bad_group_options_name_the_value():
    param = torch.zeros(1, requires_grad=True)
    with pytest.raises(ValueError, match=r"^alpha must be a finite number >= 0, got -0\.5"):
        Langevin([param], alpha=-0.5)
    with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1\), got 1\.0\.$"):
        Langevin([param], alpha=1.0)
    with pytest.raises(ValueError, match=r"^eps must be a finite number >= 0, got -1e-08"):
        Langevin([param], eps=-1e-8)
    with pytest.raises(TypeError, match=r"^preconditioned must be True or False, got 'yes'"):
        Langevin([param], preconditioned="yes")  # type: ignore[arg-type]
