"""Run under ``torchrun``: HORST, HAM and Langevin on FSDP2-sharded parameters (gloo, CPU).

Every rank trains the sharded model on the same batch, so the averaged gradient is the
single-process gradient, and checks itself against an unsharded copy trained in-process.
Failures raise, which fails the torchrun launch (and the test, with this stderr).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from convergent.optim import HAM, HORST, Langevin
from convergent.train import distributed


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    # 15 rows: the two ranks hold uneven shards (8 and 7 rows).
    return torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.Tanh(), torch.nn.Linear(15, 3))


def _shard(model: torch.nn.Module) -> torch.nn.Module:
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        inputs = torch.randn(16, 8, generator=generator)
        targets = torch.randint(0, 3, (16,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _full(model: torch.nn.Module) -> list[torch.Tensor]:
    return [param.full_tensor().detach() for param in model.parameters()]


def check_parity() -> None:
    builders = {
        "HORST foreach": lambda p: HORST(p, lr=1e-2, alpha=2.0, beta=0.1, implementation="foreach"),
        "HORST compiled": lambda p: HORST(p, lr=1e-2, alpha=2.0, beta=0.1, implementation="compiled"),
        # alpha from strength: the mean |theta| must be the whole tensors', not a shard's
        "HORST strength": lambda p: HORST(p, lr=1e-2, strength=0.5, implementation="foreach"),
        "HAM compiled": lambda p: HAM(torch.optim.AdamW(p, lr=1e-2), alpha=20.0, implementation="compiled"),
        "HAM foreach": lambda p: HAM(torch.optim.AdamW(p, lr=1e-2), alpha=20.0, implementation="foreach"),
        "Langevin s=0": lambda p: Langevin(p, lr=0.1, s=0.0),
    }  # fmt: skip
    for name, build in builders.items():
        reference = _model()
        sharded = _shard(copy.deepcopy(reference))
        _train(reference, build(reference.parameters()), 5)
        _train(sharded, build(sharded.parameters()), 5)
        for want, got in zip(reference.parameters(), _full(sharded), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6, msg=name)


NONFINITE_BUILDERS = {
    "HORST": lambda p, nonfinite: HORST(p, lr=1e-2, nonfinite=nonfinite),
    "HAM": lambda p, nonfinite: HAM(torch.optim.AdamW(p, lr=1e-2), nonfinite=nonfinite),
    "Langevin": lambda p, nonfinite: Langevin(p, lr=1e-2, s=0.5, seed=0, nonfinite=nonfinite),
}


def _nan_on_rank_one(model: torch.nn.Module) -> None:
    """Finite gradients everywhere, except one NaN in rank 1's part of the first parameter."""
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    first = next(model.parameters())
    if dist.get_rank() == 1:
        local = first.grad.to_local() if isinstance(first.grad, DTensor) else first.grad
        local.view(-1)[0] = float("nan")


def _local_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [
        (param.to_local() if isinstance(param, DTensor) else param).detach().clone()
        for param in model.parameters()
    ]


def check_nonfinite_skip_is_collective(sharded: bool) -> None:
    """A NaN on rank 1 only (in its FSDP2 shard, or in its replica's gradient as a rank-local
    NaN that no all-reduce spread): every rank skips, nothing moves, no noise is drawn."""
    for name, build in NONFINITE_BUILDERS.items():
        label = f"{name} ({'FSDP2 shards' if sharded else 'replicas'}), rank {dist.get_rank()}"
        model = _shard(_model()) if sharded else _model()
        optimizer = build(model.parameters(), "skip")
        _train(model, optimizer, 1)  # state (moments, generators) to keep
        _nan_on_rank_one(model)
        before = _local_weights(model)
        state = copy.deepcopy(optimizer.state_dict())
        optimizer.step()
        skipped = getattr(optimizer, "skipped_steps", None)
        assert skipped == 1, f"{label}: skipped_steps {skipped}"
        for want, got in zip(before, _local_weights(model), strict=True):
            assert torch.equal(want, got), f"{label}: a weight moved"
        after = optimizer.state_dict()
        for key in ("state", "noise"):
            assert _equal(state.get(key), after.get(key)), f"{label}: {key} changed"


def check_nonfinite_raise_is_collective() -> None:
    """nonfinite="raise": every rank raises, and names the same parameter."""
    for name, build in NONFINITE_BUILDERS.items():
        model = _shard(_model())
        optimizer = build(model.parameters(), "raise")
        _nan_on_rank_one(model)
        try:
            optimizer.step()
        except ValueError as error:
            want = f"{name}: the gradient of parameter 0 of param group 0 (shape [15, 8])"
            assert str(error).startswith(want), f"rank {dist.get_rank()}: {error}"
        else:
            raise AssertionError(f"{name} on rank {dist.get_rank()} did not raise")


def _equal(first: object, second: object) -> bool:
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(_equal(first[k], second[k]) for k in first)
    return first == second


def check_langevin_noise_is_independent_across_shards(implementation: str) -> None:
    # A large shard (256 x 256 per rank), so the noise's variance is known to within 0.6 %
    # (sd of a variance estimate: sqrt(2 / n)); lr * s = 0.25, so a swapped or missing factor
    # shows too.
    lr, s = 0.5, 0.5
    model = fully_shard(torch.nn.Linear(256, 512, bias=False))
    (weight,) = model.parameters()
    before = weight.to_local().detach().clone()
    optimizer = Langevin(model.parameters(), lr=lr, s=s, seed=0, implementation=implementation)
    weight.grad = torch.zeros_like(weight)
    optimizer.step()
    noise = (weight.to_local().detach() - before).double()  # this rank's shard of the draw
    count = noise.numel()
    assert count == 256 * 256
    variance = float(noise.var())
    assert abs(variance / (lr * s) - 1) < 0.03, (
        f"{implementation}: noise variance {variance}, want {lr * s}"
    )
    assert abs(float(noise.mean())) < 5 * (lr * s / count) ** 0.5
    gathered = [torch.empty_like(noise) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, noise)
    assert not torch.equal(gathered[0], gathered[1]), "both shards drew the same noise"
    correlation = float(torch.corrcoef(torch.stack([g.flatten() for g in gathered]))[0, 1])
    assert abs(correlation) < 5 / count**0.5, f"shards' noise correlated: {correlation}"
    # The state dict keeps this rank's shard stream, and a reload continues it.
    state = optimizer.state_dict()
    again = Langevin(model.parameters(), lr=lr, s=s, seed=0)
    again.load_state_dict(state)
    shard_key = next(key for key in state["noise"]["generators"] if "shard" in key)
    assert torch.equal(
        again._generators[shard_key].get_state(), optimizer._generators[shard_key].get_state()
    )


def check_langevin_under_ddp_keeps_replicas_identical() -> None:
    """Replicated (DDP) parameters draw the same noise on every rank: the replicas stay equal,
    and the noise is really there (the run differs from s = 0)."""
    from torch.nn.parallel import DistributedDataParallel

    final = {}
    for s in (0.0, 1e-2):
        model = DistributedDataParallel(_model())
        optimizer = Langevin(model.parameters(), lr=0.1, s=s, seed=0)
        generator = torch.Generator().manual_seed(10 + dist.get_rank())  # different data per rank
        for _ in range(5):
            inputs = torch.randn(8, 8, generator=generator)
            targets = torch.randint(0, 3, (8,), generator=generator)
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        final[s] = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.empty_like(final[s]) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, final[s])
        assert torch.equal(gathered[0], gathered[1]), f"DDP replicas differ at s = {s}"
    moved = float((final[1e-2] - final[0.0]).pow(2).mean().sqrt())
    # 5 steps of noise of std sqrt(0.1 * 0.01) = 0.032 each: about 0.07 in all
    assert 0.03 < moved < 0.15, f"the noise moved the weights by {moved}"


def main() -> None:
    dist.init_process_group("gloo")
    try:
        check_parity()
        for sharded in (True, False):
            check_nonfinite_skip_is_collective(sharded)
        check_nonfinite_raise_is_collective()
        for implementation in ("foreach", "reference"):
            check_langevin_noise_is_independent_across_shards(implementation)
        check_langevin_under_ddp_keeps_replicas_identical()
        distributed.shutdown()
    finally:
        # after a failed check the peer may never reach a barrier: tear down without one
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
