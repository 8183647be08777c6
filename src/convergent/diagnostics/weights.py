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


def query_key_norms(model: nn.Module) -> list[dict[str, Any]]:
    """Frobenius and spectral norms of each layer's W_Q and W_K, and ||W_Q^T W_K||_2.

    The attention logits are X W_Q^T W_K X^T / sqrt(d_head) (PyTorch stores W as
    [out, in]), so ||W_Q^T W_K||_2 bounds how peaked the softmax can get.

    Raises:
        ValueError: when no query/key projections are found; the message lists the names
            that are recognised.
    """
    rows = []
    for name, module in model.named_modules():
        children = dict(module.named_children())
        for query_name, key_name in QUERY_KEY_NAMES:
            query, key = children.get(query_name), children.get(key_name)
            if isinstance(query, nn.Linear) and isinstance(key, nn.Linear):
                w_q, w_k = query.weight.detach().float(), key.weight.detach().float()
                rows.append(
                    {
                        "layer": name,
                        "query_frobenius": float(w_q.norm()),
                        "key_frobenius": float(w_k.norm()),
                        "query_spectral": float(torch.linalg.matrix_norm(w_q, ord=2)),
                        "key_spectral": float(torch.linalg.matrix_norm(w_k, ord=2)),
                        "query_key_spectral": float(torch.linalg.matrix_norm(w_q.T @ w_k, ord=2)),
                    }
                )
                break
    if not rows:
        raise ValueError(
            f"no query/key projections found in {type(model).__name__}; recognised leaf "
            f"names are {QUERY_KEY_NAMES}"
        )
    return rows
