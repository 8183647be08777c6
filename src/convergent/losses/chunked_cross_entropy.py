"""Cross-entropy through a linear head without a [tokens x vocab] logit tensor.

    loss = mean over targets t of  logsumexp(W h_t + b) - (W h_t + b)[y_t]

computed ``chunk_tokens`` rows at a time. When a gradient is wanted, each chunk's gradient is
formed while its logits exist (softmax - one-hot, then dh = dz W, dW += dz^T h, db += sum dz),
so that forward and backward together hold one chunk x vocab block at a time and do the
three matrix products autograd would, with no recomputation (the approach of Liger-Kernel's
fused linear cross-entropy). Backward then only scales the stored gradients by the incoming
one. Positions labelled ``ignore_index`` count neither in the loss nor in its mean.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["chunked_linear_cross_entropy"]


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        features: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        chunk_tokens: int,
        ignore_index: int,
        gradients: bool,
    ) -> Tensor:
        valid = targets != ignore_index
        count = int(valid.sum())
        wants = [gradients and bool(w) for w in ctx.needs_input_grad]
        grad_features = torch.zeros_like(features) if wants[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wants[1] else None
        grad_bias = (
            torch.zeros_like(bias, dtype=torch.float32) if bias is not None and wants[2] else None
        )
        total = torch.zeros((), dtype=torch.float32, device=features.device)
        for start in range(0, features.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            keep = valid[rows]
            if not bool(keep.any()):
                continue
            hidden = features[rows]
            logits = (hidden @ weight.t()).float()
            if bias is not None:
                logits += bias.float()
            safe = torch.where(keep, targets[rows], 0)
            logsumexp = torch.logsumexp(logits, dim=1)
            picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1)
            total += torch.where(keep, logsumexp - picked, 0.0).sum()
            if grad_features is None and grad_weight is None and grad_bias is None:
                continue
            # d(loss sum)/d logits = softmax - one-hot on kept rows, 0 elsewhere; in place.
            logits.sub_(logsumexp.unsqueeze(1)).exp_()
            logits.scatter_add_(1, safe.unsqueeze(1), torch.full_like(picked, -1.0).unsqueeze(1))
            logits.mul_(keep.unsqueeze(1))
            if grad_features is not None:
                grad_features[rows] = (logits @ weight.float()).to(features.dtype)
            if grad_weight is not None:
                grad_weight += logits.t() @ hidden.float()
            if grad_bias is not None:
                grad_bias += logits.sum(0)
        scale = 1.0 / count if count else 0.0
        ctx.scale = scale
        ctx.save_for_backward(
            *(
                g if g is not None else torch.empty(0)
                for g in (grad_features, grad_weight, grad_bias)
            )
        )
        ctx.present = (grad_features is not None, grad_weight is not None, grad_bias is not None)
        ctx.dtypes = (features.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total * scale if count else total * float("nan")

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        stored = ctx.saved_tensors
        factor = grad_output * ctx.scale
        grads: list[Tensor | None] = []
        for tensor, present, dtype in zip(stored, ctx.present, ctx.dtypes, strict=True):
            grads.append((tensor * factor).to(dtype) if present else None)
        return (*grads, None, None, None, None)


def chunked_linear_cross_entropy(
    features: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    *,
    chunk_tokens: int = 1024,
    ignore_index: int = -100,
) -> Tensor:
    """Mean cross-entropy of ``features @ weight.T + bias`` against ``targets``, chunked.

    Args:
        features: ``[N, d]`` (the head's input, e.g. after the final norm).
        weight: ``[V, d]`` (an ``nn.Linear``'s weight).
        bias: ``[V]`` or None.
        targets: ``[N]`` class indices, ``ignore_index`` where there is none.
        chunk_tokens: rows per block, >= 1: the largest logit tensor is chunk_tokens x V.
        ignore_index: the label of positions without a target.

    Returns:
        The mean over the targets (NaN when there is none, as ``F.cross_entropy``), with
        gradients for ``features``, ``weight`` and ``bias`` (accumulated in float32).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens is {chunk_tokens}; it must be >= 1")
    if features.ndim != 2 or targets.shape != features.shape[:1]:
        raise ValueError(
            f"features must be [N, d] with targets [N]; got {tuple(features.shape)} and "
            f"{tuple(targets.shape)}"
        )
    # Forward runs with gradients off: say whether this call is recorded for backward.
    gradients = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (features, weight, bias)
    )
    loss: Tensor = _ChunkedLinearCrossEntropy.apply(
        features, weight, bias, targets, chunk_tokens, ignore_index, gradients
    )
    return loss
