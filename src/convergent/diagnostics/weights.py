"""Weight statistics: per-matrix sparsity and norms, and the norms of W_Q and W_K per layer.

The Langevin pillar regularizes ||W_Q||_F and ||W_K||_F, the sparsity pillar zeroes weights;
``convergent diagnose`` reports both through these functions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# (query, key) leaf names of the projection families we know.
QUERY_KEY_NAMES: tuple[tuple[str, str], ...] = (
    ("q_proj", "k_proj"),  # ours
    ("query", "key"),  # BERT, MiniLM
    ("q_lin", "k_lin"),  # DistilBERT
)


def weight_matrices(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter with at least two dimensions (linear and embedding weights), by name."""
    return {name: p.detach() for name, p in model.named_parameters() if p.dim() >= 2}


def weight_statistics(model: nn.Module) -> list[dict[str, Any]]:
    """One row per weight matrix: shape, fraction of exact zeros, mean |w|, Frobenius norm."""
    rows = []
    for name, weight in weight_matrices(model).items():
        values = weight.float()
        rows.append(
            {
                "name": name,
                "shape": "x".join(str(s) for s in values.shape),
                "sparsity": float((values == 0).float().mean()),
                "mean_abs": float(values.abs().mean()),
                "frobenius": float(values.norm()),
            }
        )
    return rows


def query_key_weights(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """W_Q and W_K of an attention ``module`` as ``[out, in]`` matrices, or None when it has
    no query/key projections we know.

    Separate projections (``q_proj``/``k_proj``, BERT's ``query``/``key``, DistilBERT's
    ``q_lin``/``k_lin``) give their weights. GPT-2's ``c_attn`` computes Q, K and V at once
    as ``x @ W + b`` with W ``[in, 3 d]`` (a ``Conv1D``), split along its outputs as GPT-2
    splits them: W_Q = W[:, :d]^T, W_K = W[:, d:2d]^T.
    """
    children = dict(module.named_children())
    for query_name, key_name in QUERY_KEY_NAMES:
        query, key = children.get(query_name), children.get(key_name)
        if isinstance(query, nn.Linear) and isinstance(key, nn.Linear):
            return query.weight.detach().float(), key.weight.detach().float()
    fused = children.get("c_attn")
    weight = getattr(fused, "weight", None)
    if "c_proj" in children and isinstance(weight, torch.Tensor) and weight.shape[1] % 3 == 0:
        width = int(getattr(module, "split_size", weight.shape[1] // 3))
        w_q, w_k, _ = weight.detach().float().split(width, dim=1)
        return w_q.T, w_k.T
    return None


def _shared_key_heads(w_q: torch.Tensor, w_k: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """W_K with each key head repeated for the query heads that share it (grouped-query
    attention, as Llama's ``num_key_value_groups``), so that W_Q^T W_K sums per-head products."""
    if w_k.shape == w_q.shape:
        return w_k
    head_dim = getattr(module, "head_dim", None)
    groups, rest = divmod(w_q.shape[0], w_k.shape[0])
    if head_dim is None or rest or w_k.shape[0] % int(head_dim):
        raise ValueError(
            f"W_Q {tuple(w_q.shape)} and W_K {tuple(w_k.shape)} do not pair up by heads"
        )
    heads = w_k.reshape(-1, int(head_dim), w_k.shape[1])
    return heads.repeat_interleave(groups, dim=0).reshape(w_q.shape[0], w_k.shape[1])


def query_key_norms(model: nn.Module) -> list[dict[str, Any]]:
    """Frobenius and spectral norms of each layer's W_Q and W_K, and ||W_Q^T W_K||_2.

    The attention logits are X W_Q^T W_K X^T / sqrt(d_head) (PyTorch stores W as
    [out, in]), so ||W_Q^T W_K||_2 bounds how peaked the softmax can get; with grouped-query
    attention each key head counts once per query head that reads it.

    Raises:
        ValueError: when no query/key projections are found; the message lists the names
            that are recognised.
    """
    rows = []
    for name, module in model.named_modules():
        weights = query_key_weights(module)
        if weights is None:
            continue
        w_q, w_k = weights
        rows.append(
            {
                "layer": name,
                "query_frobenius": float(w_q.norm()),
                "key_frobenius": float(w_k.norm()),
                "query_spectral": float(torch.linalg.matrix_norm(w_q, ord=2)),
                "key_spectral": float(torch.linalg.matrix_norm(w_k, ord=2)),
                "query_key_spectral": float(
                    torch.linalg.matrix_norm(w_q.T @ _shared_key_heads(w_q, w_k, module), ord=2)
                ),
            }
        )
    if not rows:
        raise ValueError(
            f"no query/key projections found in {type(model).__name__}; recognised leaf "
            f"names are {QUERY_KEY_NAMES} and GPT-2's fused c_attn"
        )
    return rows
