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

from convergent.optim import HAM, HORST, Langevin


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


def check_nonfinite_skip_is_collective() -> None:
    model = _shard(_model())
    optimizer = HORST(model.parameters(), lr=1e-2, nonfinite="skip")
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    first = next(model.parameters())
    if dist.get_rank() == 1:  # a NaN in rank 1's shard only
        first.grad.to_local().view(-1)[0] = float("nan")
    before = _full(model)
    optimizer.step()
    assert optimizer.skipped_steps == 1, f"rank {dist.get_rank()} did not skip"
    for want, got in zip(before, _full(model), strict=True):
        assert torch.equal(want, got)


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
        check_nonfinite_skip_is_collective()
        for implementation in ("foreach", "reference"):
            check_langevin_noise_is_independent_across_shards(implementation)
        check_langevin_under_ddp_keeps_replicas_identical()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
