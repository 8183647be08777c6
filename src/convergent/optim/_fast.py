"""Fast implementations of the HORST step: foreach ops, and one compiled pass per tensor.

Both compute what `operators.horst_reference_step` computes (with the multiplicative mirror
map) and agree with it to round-off:

- foreach: `torch._foreach_*` over all tensors of one (device, dtype); two parameter-sized
  temporaries per bucket (the denominator, reused for the exponent, and the direction u).
- compiled: `torch.compile` of the whole update over a flat view of each tensor: one read of
  theta, grad, m, v and one write of theta, m, v per element, no temporary. It folds the
  bias correction of v into the step size and eps (one division per element, not two), so
  its rounding differs from the reference's by about an ulp per step.
"""

from __future__ import annotations

import functools
import shutil
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = [
    "COMPILE_MIN_NUMEL",
    "FastPathOwner",
    "compiled_ham_step",
    "compiled_horst_step",
    "compiler_unavailable_reason",
    "fall_back",
    "foreach_horst_step",
    "use_compiled",
]

# Below this many elements in a group, "auto" does not compile: the compile would cost more
# than it saves.
COMPILE_MIN_NUMEL = 1 << 20


class FastPathOwner(Protocol):
    """An optimizer with a compiled path (HORST, HAM): its choice and why it fell back."""

    implementation: str
    fallback_reason: str | None


def foreach_horst_step(
    thetas: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: Sequence[float],
    mirror_flags: Sequence[bool],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    alpha: float,
    beta: float,
    exponent_clamp: float | None,
) -> None:
    """The HORST step in place on tensors of one device and dtype, with foreach ops."""
    if weight_decay != 0:
        torch._foreach_mul_(thetas, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    step_sizes = [lr / (1 - beta1**step) for step in steps]
    bias_corrections2_sqrt = [(1 - beta2**step) ** 0.5 for step in steps]
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denominators, bias_corrections2_sqrt)
    torch._foreach_add_(denominators, eps)
    directions = torch._foreach_mul(exp_avgs, step_sizes)
    torch._foreach_div_(directions, denominators)
    torch._foreach_sub_(thetas, directions)
    mirrored = [index for index, flag in enumerate(mirror_flags) if flag]
    if not mirrored or (alpha == 0 and beta == 0 and exponent_clamp is None):
        return  # exp(0) = 1 exactly: the mirror step would be the identity.
    halves = [thetas[index] for index in mirrored]
    exponents = [denominators[index] for index in mirrored]  # reuse the buffer
    torch._foreach_copy_(exponents, halves)
    torch._foreach_sign_(exponents)
    torch._foreach_mul_(exponents, [directions[index] for index in mirrored])
    torch._foreach_mul_(exponents, -alpha)
    torch._foreach_add_(exponents, -lr * beta)
    if exponent_clamp is not None:
        torch._foreach_clamp_min_(exponents, -exponent_clamp)
        torch._foreach_clamp_max_(exponents, exponent_clamp)
    torch._foreach_exp_(exponents)
    torch._foreach_mul_(halves, exponents)


def _horst_kernel(
    theta: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    scalars: Tensor,
    clamped: bool = True,
) -> None:  # pragma: no mutate block (torch.compile cannot trace mutmut's trampolines)
    # scalars are a tensor, not Python floats, so that a new lr or step count is not a recompile.
    (
        decay,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        step_size,
        bias_correction2_sqrt,
        eps,
        negative_alpha,
        negative_lr_beta,
        clamp,
    ) = scalars.unbind(0)
    new_exp_avg = torch.lerp(exp_avg, grad, one_minus_beta1)
    new_exp_avg_sq = exp_avg_sq * beta2 + one_minus_beta2 * grad * grad
    # step_size * m / (sqrt(v) / b + eps) == (step_size * b) * m / (sqrt(v) + eps * b): one
    # division per element instead of two (the kernel is compute-bound on CPU); the rounding
    # differs from AdamW's order by an ulp or so.
    direction = (
        new_exp_avg
        * (step_size * bias_correction2_sqrt)
        / (torch.sqrt(new_exp_avg_sq) + eps * bias_correction2_sqrt)
    )
    half = theta * decay - direction
    exponent = torch.sign(half) * direction * negative_alpha + negative_lr_beta
    if clamped:  # a constant while tracing: two compiled kernels, with and without the clamp
        exponent = torch.clamp(exponent, -clamp, clamp)
    exp_avg.copy_(new_exp_avg)
    exp_avg_sq.copy_(new_exp_avg_sq)
    theta.copy_(half * torch.exp(exponent))


_compiled_kernels: dict[tuple[Any, ...], Callable[..., None]] = {}


def compiler_unavailable_reason(device: torch.device) -> str | None:
    """Why torch.compile cannot build a fused step on `device` (from the installation alone),
    or None if it should. A compile that fails anyway is reported by the step functions."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        import torch._dynamo as dynamo

        if not dynamo.is_dynamo_supported():
            return "torch.compile does not support this Python"
    except Exception as error:  # pragma: no cover - depends on the installation
        return f"torch._dynamo failed to import ({error})"
    if device.type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler was found"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "triton is not installed"
    return None


def compiled_horst_step(
    thetas: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: Sequence[float],
    mirror_flags: Sequence[bool],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    alpha: float,
    beta: float,
    exponent_clamp: float | None,
) -> str | None:
    """The HORST step in place, one compiled pass per tensor.

    Returns:
        None when the compiled kernel ran; otherwise why it could not be compiled (nothing
        was changed then).

    Tensors must be contiguous with at least two elements (the caller routes the rest to
    the reference). A non-mirrored tensor gets alpha = beta = 0 and no clamp, so its factor
    is exp(0) = 1 exactly.
    """
    clamped = exponent_clamp is not None
    kernel = _compiled(("horst", clamped), functools.partial(_horst_kernel, clamped=clamped))
    clamp = float("inf") if exponent_clamp is None else exponent_clamp
    cache: dict[tuple[float, bool, torch.device], Tensor] = {}
    calls = []
    for theta, grad, exp_avg, exp_avg_sq, step, flag in zip(
        thetas, grads, exp_avgs, exp_avg_sqs, steps, mirror_flags, strict=True
    ):
        key = (step, flag, theta.device)
        if key not in cache:
            values = [
                1 - lr * weight_decay,
                1 - beta1,
                beta2,
                1 - beta2,
                lr / (1 - beta1**step),
                (1 - beta2**step) ** 0.5,
                eps,
                -alpha if flag else 0.0,
                -lr * beta if flag else 0.0,
                clamp if flag else float("inf"),
            ]
            cache[key] = torch.tensor(values, dtype=torch.float64, device=theta.device)
        flat = (theta.view(-1), grad.view(-1), exp_avg.view(-1), exp_avg_sq.view(-1))
        calls.append((*flat, cache[key]))
    return _run_compiled(kernel, calls)


def _ham_kernel(weight: Tensor, grad: Tensor, scalars: Tensor) -> None:  # pragma: no mutate block
    # (no mutate: torch.compile cannot trace mutmut's trampolines; the tests compare this kernel
    # with the foreach path and with the closed form, which is what a mutant would break)
    negative_lr_alpha, negative_lr_beta = scalars.unbind(0)
    weight.copy_(
        weight * torch.exp(torch.sign(weight) * grad * negative_lr_alpha + negative_lr_beta)
    )


def compiled_ham_step(
    weights: list[Tensor], grads: list[Tensor], *, lr: float, alpha: float, beta: float
) -> str | None:
    """HAM's mirror step w <- w * exp(lr * (-alpha * sign(w) * grad - beta)) in place, one
    compiled pass per tensor (read w and grad, write w); None when it ran, otherwise why it
    could not be compiled.

    Tensors must be contiguous (the caller routes the rest to the foreach path).
    """
    kernel = _compiled(("ham",), _ham_kernel)
    scalars: dict[torch.device, Tensor] = {}
    calls = []
    for weight, grad in zip(weights, grads, strict=True):
        if weight.device not in scalars:
            scalars[weight.device] = torch.tensor(
                [-lr * alpha, -lr * beta], dtype=torch.float64, device=weight.device
            )
        calls.append((weight.view(-1), grad.view(-1), scalars[weight.device]))
    return _run_compiled(kernel, calls)


def _compiled(key: tuple[Any, ...], function: Callable[..., None]) -> Callable[..., None]:
    """`function` compiled once per key (dynamic shapes, one graph)."""
    if key not in _compiled_kernels:
        _compiled_kernels[key] = torch.compile(function, dynamic=True, fullgraph=True)
    return _compiled_kernels[key]


def _run_compiled(kernel: Callable[..., None], calls: Sequence[tuple[Tensor, ...]]) -> str | None:
    """Runs `kernel` on each argument tuple; the reason if the first call fails to compile."""
    for index, arguments in enumerate(calls):
        try:
            kernel(*arguments)
        except Exception as error:
            if index > 0:
                raise  # compiled once already: a real error, not a missing compiler
            return f"torch.compile failed ({type(error).__name__}: {error})".splitlines()[0]
    return None


def use_compiled(owner: FastPathOwner, params: Sequence[Tensor], name: str) -> bool:
    """Whether ``owner`` (implementation "auto" or "compiled") should run compiled on ``params``.

    "auto" compiles groups of at least ``COMPILE_MIN_NUMEL`` elements only. Where no compiler
    is available, the owner falls back to foreach for good (see :func:`fall_back`).
    """
    if owner.implementation not in ("auto", "compiled") or not params:
        return False
    if owner.implementation == "auto" and sum(p.numel() for p in params) < COMPILE_MIN_NUMEL:
        return False
    reason = compiler_unavailable_reason(params[0].device)
    if reason is None:
        return True
    fall_back(owner, reason, name)
    return False


def fall_back(owner: FastPathOwner, reason: str, name: str) -> None:
    """Switch ``owner`` to foreach for good, with one warning and the reason kept.

    Per optimizer: another optimizer tries to compile again.
    """
    if owner.implementation != "foreach":
        warnings.warn(
            f"{name}: {reason}; using the foreach implementation instead.",
            RuntimeWarning,
            stacklevel=4,
        )
        owner.fallback_reason = reason
    owner.implementation = "foreach"
