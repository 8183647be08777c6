"""Langevin dynamics as a torch optimizer: gradient descent plus Gaussian noise.

The Euler-Maruyama step of dT = -grad V(T) dt + sqrt(s) dB with step size lr, xi ~ N(0, I):

    T <- T - lr * grad V(T) + sqrt(lr * s) * xi

As lr -> 0 the chain samples the density proportional to exp(-2 V / s), so s = 2 samples
exp(-V). Frangi et al. (2026) train attention's W_Q, W_K (or LoRA factors) this way, with V the
loss plus a Villani regularizer (`convergent.regularize`).

The temperature helpers (s in the units of posteriors, blackjax, or a loss's posterior) and
`NoiseSchedule` are in :mod:`convergent.optim.temperature`; they are imported here too.

Preconditioned (pSGLD, Li, Chen, Carlson and Carin, AAAI 2016), with RMSprop's conventions so
that s = 0 is `torch.optim.RMSprop` without momentum:

    v <- alpha * v + (1 - alpha) * grad^2;   D = sqrt(v) + eps;   G = 1 / D
    T <- T - lr * G * grad + sqrt(lr * s * G) * xi

The noise is scaled by the same preconditioner G, so the stationary density stays
exp(-2 V / s) when G changes slowly; the correction term Gamma of pSGLD (the divergence of G) is
dropped, as Li et al. do in practice.

Gradients are checked before the step: a NaN or an infinity raises, or with nonfinite="skip"
nothing changes (no parameter, no preconditioner state, no noise drawn) and the step is
counted in `skipped_steps`.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Literal, cast

import torch
from torch import Tensor
from torch.optim import Optimizer

from convergent.optim import _sharding
from convergent.optim._noise_streams import (
    SHARD_MARK,
    STREAM_MARK,
    device_key,
    draw_normal,
    noise_pool,
    process_rank,
)
from convergent.optim._nonfinite import (
    Nonfinite,
    check_nonfinite_option,
    parameter_name,
    skip_for_nonfinite_gradient,
)
from convergent.optim._validation import check_gradient, check_nonnegative
from convergent.optim.temperature import (
    NoiseSchedule,
    calibrated_s,
    describe_temperature,
    implied_noise_variance,
    posterior_s,
    s_from_temperature,
    temperature_from_s,
)

__all__ = [
    "Langevin",
    "NoiseSchedule",
    "calibrated_s",
    "describe_temperature",
    "implied_noise_variance",
    "langevin_update",
    "posterior_s",
    "rmsprop_denominator",
    "s_from_temperature",
    "temperature_from_s",
]

Implementation = Literal["reference", "foreach"]
_IMPLEMENTATIONS = ("reference", "foreach")
# noise_streams: at most this many (one thread each); a tensor below PARALLEL_NOISE_MIN
# elements has its slices drawn one after another (the same numbers, without thread overhead).
MAX_NOISE_STREAMS = 64
PARALLEL_NOISE_MIN = 1 << 16
# The foreach path draws the noise of consecutive tensors into one scratch block of at most
# this many elements (or one larger tensor), then adds it: 16 MiB of float32.
NOISE_BLOCK = 1 << 22


def rmsprop_denominator(square_avg: Tensor, grad: Tensor, alpha: float, eps: float) -> Tensor:
    """Updates `square_avg` in place (v <- alpha v + (1 - alpha) grad^2); returns sqrt(v) + eps.

    The same operations, in the same order, as `torch.optim.RMSprop` (not centered).
    """
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    return square_avg.sqrt().add_(eps)


def langevin_update(
    param: Tensor,
    grad: Tensor,
    noise: Tensor | None,
    lr: float,
    s: float,
    denominator: Tensor | None = None,
) -> Tensor:
    """One Langevin step on one tensor, returned as a new tensor.

    T - lr * grad + sqrt(lr * s) * noise, or with a preconditioner denominator D (G = 1 / D):
    T - lr * grad / D + sqrt(lr * s) * noise / sqrt(D).

    Args:
        param: T.
        grad: grad V(T).
        noise: standard normal noise shaped like `param`; may be None when s = 0.
        lr: the step size, >= 0.
        s: the diffusion coefficient, >= 0; 0 adds nothing (plain gradient descent).
        denominator: None, or the preconditioner's denominator D > 0 (`rmsprop_denominator`).
    """
    if denominator is None:
        updated = param.add(grad, alpha=-lr)
    else:
        updated = param.addcdiv(grad, denominator, value=-lr)
    if s == 0:
        return updated
    if noise is None:
        raise ValueError(f"noise is required when s > 0, got s={s!r} and noise=None.")
    scale = math.sqrt(lr * s)
    if denominator is None:
        return updated.add_(noise, alpha=scale)
    return updated.addcdiv_(noise, denominator.sqrt(), value=scale)


class Langevin(Optimizer):
    """(Preconditioned) Langevin dynamics: T <- T - lr * G * grad + sqrt(lr * s * G) * xi.

    G = 1 without preconditioning; G = 1 / (sqrt(v) + eps) with `preconditioned=True` (the
    rule is in the module docstring). s = 0 is `torch.optim.SGD` (or `torch.optim.RMSprop`)
    without momentum, bit for bit, and draws no noise.

    s is per param group and schedulable: anything may set `group["s"]` between steps (a
    `NoiseSchedule`, or your own code); it round-trips through `state_dict` with the groups.
    An LR scheduler changes lr and so the noise variance lr * s, but not the stationary
    density exp(-2 V / s).

    Noise comes from one `torch.Generator` per device, seeded from `seed`, and their states
    are part of `state_dict`, so a resumed run draws the same noise as an uninterrupted one.
    On CPU torch draws Gaussians on one thread, at several times the cost of the update
    itself; ``noise_streams=k`` draws each tensor's noise as k contiguous slices from k
    generators, in k threads (about k times faster up to the core count). The numbers are
    then other N(0, 1) draws than with one stream: fixed by (seed, k), not by the thread
    count, and a checkpoint resumes only with the k it was written with.
    Under DDP use the same seed on every rank (the default draws it from torch's global RNG,
    which `convergent.train.seed_everything` makes equal across ranks), so that every replica
    takes the same step.

    Args:
        params: parameters or parameter groups, as for any torch optimizer (named
            parameters give named error messages).
        lr: step size, >= 0.
        s: diffusion coefficient, >= 0 (temperature = s / 2 in posteriors and blackjax). To
            state it in loss units, pass ``s=posterior_s(N, K, noise_variance)`` (an averaged
            squared error) or ``s=posterior_s(N)`` (cross-entropy), scaled as
            `posterior_s` explains; `describe_temperature` reads any s back in those units.
        preconditioned: use RMSprop preconditioning (pSGLD); settable per group.
        alpha: RMSprop's decay of the squared-gradient average, in [0, 1).
        eps: added to sqrt(v), >= 0.
        seed: seed of the noise generators; None draws one from torch's global RNG.
        generator: a generator to use for parameters on its device (its state is saved and
            restored with the optimizer); other devices get generators seeded from `seed`.
        noise_streams: generators (and threads) per CPU device for the noise draw, in
            [1, 64]; 1 (default) is one `torch.randn` per tensor. Other devices draw with one.
        implementation: "foreach" (default, multi-tensor ops) or "reference" (one tensor at a
            time through `langevin_update`); both draw the same noise and agree bit for bit
            on CPU. "foreach" keeps one scratch buffer per (device, dtype) for the noise
            draw, as large as the largest block of consecutive parameters of that device and
            dtype (blocks hold at most 2**22 elements, or one larger parameter; with
            ``noise_streams`` > 1 a block is every such parameter, as large as they are).
        nonfinite: "raise" (default): a NaN or infinite gradient raises a ValueError naming
            the parameter, before anything changes; "skip": the whole step is skipped (no
            parameter or state changes and no noise is drawn, so the noise stream continues
            as if the step had not been taken) and counted in `skipped_steps`, which
            `state_dict` keeps. Under a process group all ranks decide together; "ignore": no
            check, as in torch.optim (for a loop that checks already; a NaN then reaches the
            weights and the state).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        s: float = 0.0,
        *,
        preconditioned: bool = False,
        alpha: float = 0.99,
        eps: float = 1e-8,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        implementation: Implementation = "foreach",
        nonfinite: Nonfinite = "raise",
        noise_streams: int = 1,
    ) -> None:
        if implementation not in _IMPLEMENTATIONS:
            raise ValueError(
                f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}."
            )
        check_nonfinite_option(nonfinite)
        self.nonfinite = nonfinite
        self.skipped_steps = 0
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0 or None, got {seed!r}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}.")
        if (
            isinstance(noise_streams, bool)
            or not isinstance(noise_streams, int)
            or not 1 <= noise_streams <= MAX_NOISE_STREAMS
        ):
            raise ValueError(
                f"noise_streams={noise_streams!r} is out of range; allowed are integers in "
                f"[1, {MAX_NOISE_STREAMS}]."
            )
        self.seed = seed
        self.noise_streams = noise_streams
        self.implementation: Implementation = implementation
        self._generators: dict[str, torch.Generator] = {}
        # Noise scratch, one per (device, dtype), as large as the largest noise block; not state.
        self._scratch_buffers: dict[tuple[torch.device, torch.dtype], Tensor] = {}
        if generator is not None:
            self._generators[device_key(generator.device)] = generator
        defaults = {"lr": lr, "s": s, "preconditioned": preconditioned, "alpha": alpha, "eps": eps}
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        merged = {**self.defaults, **param_group}
        for name in ("lr", "s", "eps"):
            check_nonnegative(name, merged[name])
        check_nonnegative("alpha", merged["alpha"])
        if not merged["alpha"] < 1:
            raise ValueError(f"alpha must be in [0, 1), got {merged['alpha']!r}.")
        if not isinstance(merged["preconditioned"], bool):
            raise TypeError(
                f"preconditioned must be True or False, got {merged['preconditioned']!r}."
            )
        super().add_param_group(param_group)

    def generator_for(
        self, device: torch.device, *, shard: bool = False, stream: int = 0
    ) -> torch.Generator:
        """The noise generator of `device`, created (seeded from `seed`) on first use.

        With `shard=True`, the generator for the local shards of FSDP2-sharded parameters: its
        seed also depends on the rank, so that different ranks (different elements) draw
        independent noise, while replicated parameters keep one stream on every rank.
        ``stream`` > 0 names the further generators of ``noise_streams``.
        """
        key = device_key(device)
        if shard:
            key = f"{key}{SHARD_MARK}{process_rank()}"
        if stream:
            key = f"{key}{STREAM_MARK}{stream}"
        if key not in self._generators:
            # Distinct devices get distinct streams: the seed is offset by the creation order.
            generator = torch.Generator(device=device)
            offset = 7919 * len(self._generators) + (104729 * (process_rank() + 1) if shard else 0)
            generator.manual_seed(self.seed + offset)
            self._generators[key] = generator
        return self._generators[key]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["noise"] = {
            "seed": self.seed,
            "streams": self.noise_streams,
            "generators": {key: gen.get_state() for key, gen in self._generators.items()},
        }
        state["skipped_steps"] = self.skipped_steps
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        noise = state_dict.pop("noise", None)
        streams = 1 if noise is None else int(noise.get("streams", 1))
        if noise is not None and streams != self.noise_streams:  # checked before any change
            raise ValueError(
                f"the checkpoint drew its noise with noise_streams={streams}, this optimizer has "
                f"noise_streams={self.noise_streams}; create it with noise_streams={streams} to "
                "resume the same noise."
            )
        self.skipped_steps = int(state_dict.pop("skipped_steps", 0))
        super().load_state_dict(state_dict)
        if noise is None:
            return
        self.seed = int(noise["seed"])
        for key, generator_state in noise["generators"].items():
            base, _, stream = key.partition(STREAM_MARK)
            device, shard = base.split(SHARD_MARK)[0], SHARD_MARK in base
            if shard and base != f"{device}{SHARD_MARK}{process_rank()}":
                continue  # another rank's shard stream
            generator = self.generator_for(
                torch.device(device), shard=shard, stream=int(stream or 0)
            )
            generator.set_state(generator_state.cpu())

    def _scratch(self, param: Tensor, numel: int) -> Tensor:
        """``numel`` elements of ``param``'s device and dtype, flat: a view of one
        per-(device, dtype) scratch tensor."""
        key = (param.device, param.dtype)
        buffer = self._scratch_buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=param.dtype, device=param.device)
            self._scratch_buffers[key] = buffer
        return buffer[:numel]

    def _fill_noise(self, outs: list[Tensor], shards: list[bool]) -> None:
        """Fills each of ``outs`` (contiguous) with N(0, 1) noise, tensor by tensor.

        One stream: one draw per tensor from its device's generator. ``noise_streams`` = k on
        CPU: each tensor as k contiguous slices, slice i from generator i; thread i draws its
        slices of every tensor in order, so the numbers depend on k but not on how the tensors
        are batched into calls or whether threads are used.
        """
        streams = self.noise_streams
        per_stream: list[list[tuple[Tensor, torch.Generator]]] = [[] for _ in range(streams)]
        for out, shard in zip(outs, shards, strict=True):
            if streams == 1 or out.device.type != "cpu":
                out.normal_(generator=self.generator_for(out.device, shard=shard))
                continue
            for index, piece in enumerate(out.view(-1).tensor_split(streams)):
                generator = self.generator_for(out.device, shard=shard, stream=index)
                per_stream[index].append((piece, generator))
        if not per_stream[0]:
            return
        if sum(piece.numel() for piece, _ in per_stream[0]) * streams < PARALLEL_NOISE_MIN:
            for pieces in per_stream:
                draw_normal(pieces)
            return
        # torch releases the GIL inside normal_: the streams fill in parallel, one task each
        # (a task per tensor would pay a thread hand-off, and compete with OpenMP's spinning
        # threads, once per tensor).
        pool = noise_pool(streams)
        futures = [pool.submit(draw_normal, pieces) for pieces in per_stream]
        concurrent.futures.wait(futures)  # every thread is done with the buffers, even on error
        for future in futures:
            future.result()

    def _draw_noise(self, params: list[Tensor], sharded: list[bool]) -> list[Tensor]:
        # One draw per tensor in parameter order, so both implementations see the same noise.
        noises = [
            torch.empty(param.shape, dtype=param.dtype, device=param.device) for param in params
        ]
        self._fill_noise(noises, sharded)
        return noises

    def _add_noise(self, params: list[Tensor], sharded: list[bool], scale: float) -> None:
        """params += scale * noise through the scratch buffer, in blocks of consecutive tensors
        of one device and dtype: of at most `NOISE_BLOCK` elements (or one larger tensor) with
        one stream, all of them with several. A block's noise is drawn in one call (in
        parallel with several streams), then added."""
        # With several streams the whole list is one block: the parallel draw must not take
        # turns with the (OpenMP-parallel) adds, whose idle threads slow the draw down (2
        # streams measured 68 ms against 40 ms for the same draw in one call, 25 M numbers).
        start = 0
        while start < len(params):
            streamed = self.noise_streams > 1 and params[start].device.type == "cpu"
            limit = math.inf if streamed else NOISE_BLOCK
            stop, numel = start + 1, params[start].numel()
            while (
                stop < len(params)
                and params[stop].device == params[start].device
                and params[stop].dtype == params[start].dtype
                and numel + params[stop].numel() <= limit
            ):
                numel += params[stop].numel()
                stop += 1
            flat = self._scratch(params[start], numel)
            noises = [
                piece.view(param.shape)
                for piece, param in zip(
                    flat.split([param.numel() for param in params[start:stop]]),
                    params[start:stop],
                    strict=True,
                )
            ]
            self._fill_noise(noises, sharded[start:stop])
            torch._foreach_add_(params[start:stop], noises, alpha=scale)
            start = stop

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Takes one Langevin step; `closure` re-evaluates the loss and returns it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        batches: list[tuple[dict[str, Any], list[Tensor]]] = []
        for group_index, group in enumerate(self.param_groups):
            params = []
            for param_index, param in enumerate(group["params"]):
                if param.grad is None:
                    continue
                check_gradient(
                    partial(parameter_name, group, group_index, param_index), param, param.grad
                )
                params.append(param)
            batches.append((group, params))
        if skip_for_nonfinite_gradient("Langevin", self.param_groups, self.nonfinite):
            self.skipped_steps += 1
            return loss
        for group, params in batches:
            if params:
                self._update_group(group, params)
        return loss

    def _update_group(self, group: dict[str, Any], parameters: list[Tensor]) -> None:
        lr, s = float(group["lr"]), float(group["s"])
        alpha, eps = float(group["alpha"]), float(group["eps"])
        # Elementwise: FSDP2 (DTensor) parameters are updated shard by shard, with their own
        # noise stream per rank.
        sharded = [_sharding.is_sharded(param) for param in parameters]
        params = [_sharding.local(param) for param in parameters]
        grads = [_sharding.local(cast(Tensor, param.grad)) for param in parameters]
        square_avgs: list[Tensor] = []
        if group["preconditioned"]:
            for param in parameters:
                state = self.state[param]
                if "square_avg" not in state:
                    state["step"] = torch.tensor(0.0)
                    state["square_avg"] = torch.zeros_like(
                        param, memory_format=torch.preserve_format
                    )
                state["step"] += 1
                square_avgs.append(_sharding.local(state["square_avg"]))
        if self.implementation == "foreach" and not group["preconditioned"] and s > 0:
            # Gradient step for all tensors at once, then the noise block by block through a
            # reused scratch buffer: no fresh parameter-sized allocation (and page faults) per
            # step, and the generators are consumed exactly as the reference's per-tensor draws.
            _foreach_langevin(params, grads, None, None, lr, 0.0, alpha, eps)
            self._add_noise(params, sharded, math.sqrt(lr * s))
            return
        noises = self._draw_noise(params, sharded) if s > 0 else None
        if self.implementation == "reference":
            for index, param in enumerate(params):
                denominator = None
                if square_avgs:
                    denominator = rmsprop_denominator(square_avgs[index], grads[index], alpha, eps)
                noise = None if noises is None else noises[index]
                param.copy_(langevin_update(param, grads[index], noise, lr, s, denominator))
            return
        _foreach_langevin(params, grads, noises, square_avgs or None, lr, s, alpha, eps)


def _foreach_langevin(
    params: list[Tensor],
    grads: list[Tensor],
    noises: list[Tensor] | None,
    square_avgs: list[Tensor] | None,
    lr: float,
    s: float,
    alpha: float,
    eps: float,
) -> None:
    """`langevin_update` on a list of tensors with multi-tensor ops, in place."""
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, param in enumerate(params):
        buckets.setdefault((param.device, param.dtype), []).append(index)
    scale = math.sqrt(lr * s)
    for indices in buckets.values():
        thetas = [params[i] for i in indices]
        gradients = [grads[i] for i in indices]
        if square_avgs is None:
            torch._foreach_add_(thetas, gradients, alpha=-lr)
            if noises is not None:
                torch._foreach_add_(thetas, [noises[i] for i in indices], alpha=scale)
            continue
        averages = [square_avgs[i] for i in indices]
        torch._foreach_mul_(averages, alpha)
        torch._foreach_addcmul_(averages, gradients, gradients, value=1 - alpha)
        denominators = torch._foreach_sqrt(averages)
        torch._foreach_add_(denominators, eps)
        torch._foreach_addcdiv_(thetas, gradients, denominators, value=-lr)
        if noises is not None:
            roots = torch._foreach_sqrt(denominators)
            torch._foreach_addcdiv_(thetas, [noises[i] for i in indices], roots, value=scale)
