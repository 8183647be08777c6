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
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from convergent.optim.operators import HorstHyperparameters

__all__ = [
    "CHUNK_TENSORS",
    "COMPILE_MIN_NUMEL",
    "POLYNOMIAL_EXPONENT_LIMIT",
    "FastPathOwner",
    "adam_ratio_bound",
    "compiled_ham_step",
    "compiled_horst_step",
    "compiler_unavailable_reason",
    "exp_polynomial",
    "fall_back",
    "foreach_horst_step",
    "horst_exponent_bound",
    "polynomial_exp_allowed",
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
    hyperparameters: HorstHyperparameters,
) -> None:
    """The HORST step in place on tensors of one device and dtype, with foreach ops."""
    lr, beta1, beta2, eps, weight_decay, alpha, beta, exponent_clamp = hyperparameters
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


# A compiled call steps this many tensors (or the rest): one call per tensor pays the
# compiled function's dispatch and guards each time, one call per group would compile a graph
# as large as the model (minutes for a few hundred tensors).
CHUNK_TENSORS = 16
# |exponent| at most this: exp by its degree-5 Taylor polynomial (`exp_polynomial`), whose
# truncation error there is below |x|^6 / 720 * e^|x| < 2^-33, far under float32 rounding.
POLYNOMIAL_EXPONENT_LIMIT = 1.0 / 16.0


def exp_polynomial(x: Tensor) -> Tensor:
    """exp(x) by its Taylor polynomial of degree 5 (Horner): five fused multiply-adds instead
    of a vectorized exp, for |x| <= `POLYNOMIAL_EXPONENT_LIMIT` only."""
    return 1 + x * (1 + x * (0.5 + x * (1 / 6 + x * (1 / 24 + x * (1 / 120)))))


def polynomial_exp_allowed(dtype: torch.dtype, exponent_bounds: Sequence[float]) -> bool:
    """Whether exp may be `exp_polynomial` for tensors of ``dtype`` whose exponents are bounded
    by ``exponent_bounds``: float32 and narrower only (its 2^-33 error is no float64 round-off)
    and every bound within `POLYNOMIAL_EXPONENT_LIMIT`."""
    return dtype != torch.float64 and all(
        bound <= POLYNOMIAL_EXPONENT_LIMIT for bound in exponent_bounds
    )


def _adamw_mirror_body(
    theta: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    scalars: Tensor,
    clamped: bool,
    polynomial: bool,
    gradient_exponent: bool,
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
    # HORST's exponent reads the Adam direction u, HAM's the raw gradient (its negative_alpha
    # then carries the learning rate).
    moved = grad if gradient_exponent else direction
    exponent = torch.sign(half) * moved * negative_alpha + negative_lr_beta
    if clamped:  # constants while tracing: one compiled graph per combination
        exponent = torch.clamp(exponent, -clamp, clamp)
    factor = exp_polynomial(exponent) if polynomial else torch.exp(exponent)
    exp_avg.copy_(new_exp_avg)
    exp_avg_sq.copy_(new_exp_avg_sq)
    theta.copy_(half * factor)


def _adamw_mirror_kernel(
    thetas: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    scalars: Tensor,
    clamped: bool = True,
    polynomial: bool = False,
    gradient_exponent: bool = False,
) -> None:  # pragma: no mutate block
    for index, theta in enumerate(thetas):
        _adamw_mirror_body(
            theta,
            grads[index],
            exp_avgs[index],
            exp_avg_sqs[index],
            scalars[index],
            clamped,
            polynomial,
            gradient_exponent,
        )


def horst_exponent_bound(
    ratio_bound: float, step: float, hyperparameters: HorstHyperparameters
) -> float:
    """An upper bound on |exponent| of HORST's mirror step for one tensor.

    With R >= max |m| / sqrt(v) over the tensor (`adam_ratio_bound`), the direction obeys
    |u| = lr / (1 - beta1^t) * |m| / (sqrt(v) / sqrt(1 - beta2^t) + eps)
        <= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * R,
    so |alpha * sign * u + lr * beta| <= alpha * that + lr * |beta|.
    """
    lr, beta1, beta2 = hyperparameters.lr, hyperparameters.beta1, hyperparameters.beta2
    scale = lr * (1 - beta2**step) ** 0.5 / (1 - beta1**step)
    return abs(hyperparameters.alpha) * scale * ratio_bound + lr * abs(hyperparameters.beta)


def adam_ratio_bound(previous: float, beta1: float, beta2: float) -> float:
    """A bound on max |m_t| / sqrt(v_t) after one more Adam moment update, from one on the
    moments before it (0 for fresh, zero moments).

    m_t = beta1 m + (1 - beta1) g and v_t >= max(beta2 v, (1 - beta2) g^2) give
    |m_t| / sqrt(v_t) <= beta1 / sqrt(beta2) * previous + (1 - beta1) / sqrt(1 - beta2),
    whatever the gradient; it holds for betas that change between steps too.
    """
    if beta2 <= 0 or beta2 >= 1:
        return float("inf")
    return beta1 / beta2**0.5 * previous + (1 - beta1) / (1 - beta2) ** 0.5


_compiled_kernels: dict[tuple[Any, ...], Callable[..., None]] = {}


def compiler_unavailable_reason(device: torch.device) -> str | None:
    """Why torch.compile cannot build a fused step on `device` (from the installation alone),
    or None if it should. A compile that fails anyway is reported by the step functions.

    Asked on every step: the answer is kept per device type (finding a C++ compiler on PATH
    costs several file-system lookups)."""
    return _compiler_unavailable_reason(device.type)


@functools.cache
def _compiler_unavailable_reason(device_type: str) -> str | None:
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        import torch._dynamo as dynamo

        if not dynamo.is_dynamo_supported():
            return "torch.compile does not support this Python"
    except Exception as error:  # pragma: no cover - depends on the installation
        return f"torch._dynamo failed to import ({error})"
    if device_type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler was found"
    if device_type == "cuda":
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
    hyperparameters: HorstHyperparameters,
    *,
    polynomial: bool = False,
    gradient_exponent: bool = False,
) -> str | None:
    """The HORST step in place, compiled, `CHUNK_TENSORS` tensors per call.

    Args:
        hyperparameters: the group's numbers; only whether exponent_clamp is None selects a
            compiled graph (the numbers travel as a tensor, so a new lr is no recompile).
        polynomial: exp by `exp_polynomial`; only where every mirrored tensor's exponent is
            known to stay within `POLYNOMIAL_EXPONENT_LIMIT` (`horst_exponent_bound`).
        gradient_exponent: the mirror exponent reads the raw gradient, not the Adam direction:
            AdamW followed by HAM's mirror step (alpha is then HAM's lr * alpha, beta its beta).

    Returns:
        None when the compiled kernel ran; otherwise why it could not be compiled (nothing
        was changed then).

    Tensors must be contiguous with at least two elements (the caller routes the rest to
    the reference). A non-mirrored tensor gets alpha = beta = 0 and no clamp, so its factor
    is exactly 1.
    """
    lr, beta1, beta2, eps, weight_decay, alpha, beta, exponent_clamp = hyperparameters
    clamped = exponent_clamp is not None
    key = ("adamw mirror", clamped, polynomial, gradient_exponent)
    kernel = _compiled(
        key,
        functools.partial(
            _adamw_mirror_kernel,
            clamped=clamped,
            polynomial=polynomial,
            gradient_exponent=gradient_exponent,
        ),
    )
    clamp = float("inf") if exponent_clamp is None else exponent_clamp
    rows = [
        [
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
        for step, flag in zip(steps, mirror_flags, strict=True)
    ]
    calls = []
    for start in range(0, len(thetas), CHUNK_TENSORS):
        chunk = slice(start, start + CHUNK_TENSORS)
        device = thetas[start].device
        calls.append(
            (
                [theta.view(-1) for theta in thetas[chunk]],
                [grad.view(-1) for grad in grads[chunk]],
                [exp_avg.view(-1) for exp_avg in exp_avgs[chunk]],
                [exp_avg_sq.view(-1) for exp_avg_sq in exp_avg_sqs[chunk]],
                torch.tensor(rows[chunk], dtype=torch.float64, device=device),
            )
        )
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


# Compiled graphs per kernel before dynamo gives up (its default is 8): each chunk length,
# dtype and device of a kernel is one graph, and a model with many parameter groups has many.
RECOMPILE_LIMIT = 64


def _compiled(key: tuple[Any, ...], function: Callable[..., None]) -> Callable[..., None]:
    """`function` compiled once per key (dynamic shapes), on a code object of its own: dynamo
    counts recompiles per code object, and one key's graphs must not use up another's."""
    if key not in _compiled_kernels:
        base = function.func if isinstance(function, functools.partial) else function
        code = base.__code__.replace(co_name=f"{base.__name__}_{len(_compiled_kernels)}")
        own: Callable[..., None] = types.FunctionType(
            code, base.__globals__, code.co_name, base.__defaults__
        )
        if isinstance(function, functools.partial):
            own = functools.partial(own, *function.args, **function.keywords)
        _compiled_kernels[key] = torch.compile(own, dynamic=True, fullgraph=True)
    return _compiled_kernels[key]


def _run_compiled(kernel: Callable[..., None], calls: Sequence[tuple[Any, ...]]) -> str | None:
    """Runs `kernel` on each argument tuple; the reason if the first call fails to compile."""
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(recompile_limit=RECOMPILE_LIMIT):
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
