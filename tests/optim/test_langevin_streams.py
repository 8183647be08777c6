"""Langevin's ``noise_streams``: each tensor's noise as k slices from k generators, in k threads.

Expected values come from torch's own generators, seeded as the docstring of `generator_for`
says (stream i is the i-th generator created: seed + 7919 i), and from scipy's tests of law.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from scipy import stats

from convergent.optim.langevin import PARALLEL_NOISE_MIN, Langevin

BIG = PARALLEL_NOISE_MIN * 3 + 5  # drawn in threads, and not divisible by 2 or 4
SMALL = 101  # drawn in one thread


def _noise_of_one_step(sizes: list[int], streams: int, seed: int = 7, **options) -> list:
    """The noise a step with zero gradients and lr * s = 1 adds to zero parameters."""
    params = [torch.nn.Parameter(torch.zeros(size)) for size in sizes]
    for param in params:
        param.grad = torch.zeros_like(param)
    optimizer = Langevin(params, lr=1.0, s=1.0, seed=seed, noise_streams=streams, **options)
    optimizer.step()
    return [param.detach().clone() for param in params]


def _expected(sizes: list[int], streams: int, seed: int = 7) -> list[torch.Tensor]:
    """k generators seeded seed + 7919 i; each tensor split into k near-equal contiguous
    slices (the first ones one longer), slice i drawn from generator i, tensor by tensor."""
    generators = [torch.Generator().manual_seed(seed + 7919 * i) for i in range(streams)]
    out = []
    for size in sizes:
        base, extra = divmod(size, streams)
        pieces = [
            torch.randn(base + (1 if i < extra else 0), generator=generators[i])
            for i in range(streams)
        ]
        out.append(torch.cat(pieces))
    return out


@pytest.mark.parametrize("implementation", ["reference", "foreach"])
@pytest.mark.parametrize("streams", [1, 2, 3])
def test_each_slice_comes_from_its_own_generator(implementation, streams):
    sizes = [BIG, SMALL, 2]  # threads, one thread, fewer elements than some stream counts
    got = _noise_of_one_step(sizes, streams, implementation=implementation)
    for noise, expected in zip(got, _expected(sizes, streams), strict=True):
        torch.testing.assert_close(noise, expected, rtol=0, atol=0)


def test_two_streams_draw_standard_normal_independent_noise():
    first, second = (_noise_of_one_step([BIG], 2, seed=seed)[0].numpy() for seed in (1, 2))
    reference = torch.randn(BIG, generator=torch.Generator().manual_seed(3)).numpy()
    # the law: a two-sample test against torch.randn, and the first four moments
    assert stats.ks_2samp(first, reference).pvalue > 1e-3
    n = first.size
    assert abs(first.mean()) < 5 / np.sqrt(n)
    assert abs(first.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(stats.skew(first)) < 5 * np.sqrt(6 / n)
    assert abs(stats.kurtosis(first)) < 5 * np.sqrt(24 / n)
    # the two halves (two generators) are uncorrelated, and so are two seeds
    half = n // 2
    for a, b in ((first[:half], first[half : 2 * half]), (first, second)):
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(len(a))


def test_resume_needs_the_same_stream_count_and_then_repeats_the_noise():
    def run(optimizer, params, steps):
        for _ in range(steps):
            for param in params:
                param.grad = torch.ones_like(param) * 0.1
            optimizer.step()

    straight = [torch.nn.Parameter(torch.zeros(BIG))]
    run(Langevin(straight, lr=0.1, s=1.0, seed=5, noise_streams=2), straight, 4)

    split = [torch.nn.Parameter(torch.zeros(BIG))]
    optimizer = Langevin(split, lr=0.1, s=1.0, seed=5, noise_streams=2)
    run(optimizer, split, 2)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert sorted(saved["noise"]["generators"]) == ["cpu", "cpu#stream-1"]
    one_stream = Langevin(split, lr=0.3, s=1.0, seed=0)
    with pytest.raises(ValueError, match=r"noise_streams=2, this optimizer has noise_streams=1"):
        one_stream.load_state_dict(saved)
    # nothing was loaded: the groups and the counters are the optimizer's own
    assert one_stream.param_groups[0]["lr"] == 0.3 and one_stream.state == {}
    resumed = Langevin(split, lr=0.1, s=1.0, seed=0, noise_streams=2)
    resumed.load_state_dict(saved)
    run(resumed, split, 2)
    torch.testing.assert_close(split[0].detach(), straight[0].detach(), rtol=0, atol=0)


@pytest.mark.parametrize("bad", [0, 65, True, 1.5, "2"])
def test_bad_stream_counts_name_the_value_and_the_range(bad):
    with pytest.raises(ValueError, match=rf"noise_streams={bad!r} is out of range.*\[1, 64\]"):
        Langevin([torch.nn.Parameter(torch.zeros(2))], noise_streams=bad)


@pytest.mark.parametrize("streams", [1, 2])
def test_noise_blocks_do_not_change_the_numbers(streams, monkeypatch):
    from convergent.optim import langevin

    sizes = [BIG, 60, 50, 40, 2]
    monkeypatch.setattr(langevin, "NOISE_BLOCK", 150)  # blocks [BIG], [60, 50, 40], [2]
    got = _noise_of_one_step(sizes, streams, implementation="foreach")
    for noise, expected in zip(got, _expected(sizes, streams), strict=True):
        torch.testing.assert_close(noise, expected, rtol=0, atol=0)


def _step_in_child(queue) -> None:
    params = [torch.nn.Parameter(torch.zeros(BIG))]
    params[0].grad = torch.zeros_like(params[0])
    Langevin(params, lr=1.0, s=1.0, seed=7, noise_streams=2).step()
    queue.put(params[0].detach().numpy().copy())  # plain pickling, no shared memory


def test_a_forked_child_draws_with_its_own_threads():
    import multiprocessing

    _noise_of_one_step([BIG], 2)  # the parent's pool exists now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_step_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=60)  # a child waiting on the parent's threads would hang here
    child.join(timeout=60)
    assert child.exitcode == 0
    torch.testing.assert_close(torch.from_numpy(got), _expected([BIG], 2)[0], rtol=0, atol=0)
