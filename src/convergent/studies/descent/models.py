"""The ``descent`` study's models and their training: MiniLM-L6 with a fresh classification
head for part (a), an unrolled Transformer denoiser for part (b), a GPT-style causal language
model for part (c), and one training routine in which ERM and the descent-constrained model
differ only by the training step (same AdamW, warm-up, clipping, steps and seed).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from convergent.models import Transformer, TransformerConfig
from convergent.train import ErmStep, descent_step, fit, seed_everything, warmup_schedule


def denoiser(seed: int, patch: int, tokens: int, d_model: int, layers: int) -> Transformer:
    """An unrolled denoiser: L pre-norm blocks whose every layer is read out to clean pixels."""
    seed_everything(seed)
    config = TransformerConfig(
        task="regression",
        input_dim=patch * patch,
        num_outputs=patch * patch,
        max_len=tokens,
        d_model=d_model,
        n_heads=4,
        n_layers=layers,
        pooling="token",
        norm="pre",
    )
    return Transformer(config).train()


def language_model(
    seed: int, vocab_size: int, max_length: int, width: int, heads: int, layers: int
) -> Transformer:
    """A GPT-style decoder: L pre-norm causal blocks, learned positions, and one LM head tied to
    the token embedding, through which every layer is read out (after the final norm)."""
    seed_everything(seed)
    config = TransformerConfig(
        task="lm",
        vocab_size=vocab_size,
        max_len=max_length,
        d_model=width,
        n_heads=heads,
        n_layers=layers,
        causal=True,
        norm="pre",
        tie_embeddings=True,
    )
    return Transformer(config).train()


def train_model(
    model: nn.Module,
    method: str,
    train: Any,
    *,
    task: str,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    alpha: float,
    dual_lr: float,
    resilient_cost: float | None,
    progress: bool,
    weight_decay: float = 0.01,
    token_fraction: float | None = None,
) -> dict[str, Any]:
    """Train ``model`` by ERM or primal-dual with the same AdamW, warm-up and clipping
    (``token_fraction``: a language model's inner layers read out at that share of the target
    tokens in each primal-dual step).

    Returns:
        ``{"train_loss", "multipliers", "history"}`` (multipliers: the final lambda, or []).
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = warmup_schedule(optimizer, steps, warmup_steps=steps // 10, kind="linear")
    step = (
        ErmStep(task)
        if method == "erm"
        else descent_step(
            task,
            model.num_layers,  # type: ignore[arg-type]
            alpha=alpha,
            dual_lr=dual_lr,
            resilient_cost=resilient_cost,
            token_fraction=token_fraction,
            seed=seed,
        )
    )
    result = fit(
        model,
        optimizer,
        train,
        max_steps=steps,
        batch_size=batch_size,
        task=task,
        training_step=step,
        scheduler=scheduler,
        grad_clip=1.0,
        seed=seed,
        progress=progress,
        tensorboard=False,
    )
    multipliers = step.dual.value().tolist() if method != "erm" else []  # type: ignore[union-attr]
    return {"train_loss": result.train_loss, "multipliers": multipliers, "history": result.history}
