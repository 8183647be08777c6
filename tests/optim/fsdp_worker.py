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


def check_langevin_noise_is_independent_across_shards() -> None:
    model = fully_shard(torch.nn.Linear(8, 16, bias=False))
    (weight,) = model.parameters()
    before = weight.to_local().detach().clone()
    optimizer = Langevin(model.parameters(), lr=1.0, s=1.0, seed=0)
    weight.grad = torch.zeros_like(weight)
    optimizer.step()
    noise = weight.to_local().detach() - before  # this rank's 8 x 8 shard of the draw
    gathered = [torch.empty_like(noise) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, noise)
    assert not torch.equal(gathered[0], gathered[1]), "both shards drew the same noise"
    assert 0.5 < float(noise.std()) < 1.5  # sqrt(lr * s) = 1
    # The state dict keeps this rank's shard stream, and a reload continues it.
    state = optimizer.state_dict()
    again = Langevin(model.parameters(), lr=1.0, s=1.0, seed=0)
    again.load_state_dict(state)
    shard_key = next(key for key in state["noise"]["generators"] if "shard" in key)
    assert torch.equal(
        again._generators[shard_key].get_state(), optimizer._generators[shard_key].get_state()
    )


def main() -> None:
    dist.init_process_group("gloo")
    try:
        check_parity()
        check_nonfinite_skip_is_collective()
        check_langevin_noise_is_independent_across_shards()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
