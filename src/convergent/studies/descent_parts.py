"""The measurements of the ``descent`` study, as functions of plain arguments.

Part (a): MiniLM-L6 sentiment on rt-sentences, accuracy under token-embedding
perturbations. Part (b): an unrolled Transformer denoiser on patches of street-video
frames, RMSE under noise levels beyond the training level. Both parts train an ERM model
and a descent-constrained model with the same optimizer, schedule, steps and seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..data import DictDataset, minilm_path
from ..data.perturb import perturbed_embeddings
from ..diagnostics.layerwise import monotonicity_report
from ..models import HFEncoder, Transformer, TransformerConfig
from ..train import ErmStep, evaluate, fit, seed_everything, warmup_schedule
from ..train.primal_dual import dataset_layer_losses, descent_step

METHODS = ("erm", "constrained")


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
) -> dict[str, Any]:
    """Train ``model`` by ERM or primal-dual with the same AdamW, warm-up and clipping.

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


def multiplier_activity(history: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """How hard the descent constraints pushed during training, from ``fit``'s history.

    A primal-dual step logs ``lambda_1 .. lambda_L`` each step (after that step's dual
    update). A run whose multipliers stay near 0 trained on f_L alone: ERM in all but name.

    Args:
        history: the per-step records ``fit`` returns; records of other splits and records
            without multipliers (ERM) are ignored.

    Returns:
        ``{"multiplier_max": max over steps and layers of lambda_l,
        "multiplier_active_share": share of logged steps with some lambda_l > 0}``; both
        None when no record holds a multiplier.
    """
    per_step = [
        [float(value) for key, value in record.items() if key.startswith("lambda_")]
        for record in history
        if record.get("split", "train") == "train"
    ]
    per_step = [values for values in per_step if values]
    if not per_step:
        return {"multiplier_max": None, "multiplier_active_share": None}
    return {
        "multiplier_max": max(max(values) for values in per_step),
        "multiplier_active_share": sum(max(values) > 0 for values in per_step) / len(per_step),
    }


def layer_report(
    model: nn.Module, data: Any, task: str, alpha: float, batch_size: int = 256
) -> dict[str, Any]:
    """Per-layer losses on ``data``, and which descent constraints hold there."""
    losses = dataset_layer_losses(model, data, task, batch_size).tolist()
    at_alpha = monotonicity_report(losses, alpha)
    monotone = monotonicity_report(losses, 0.0)
    return {
        "layer_losses": losses,
        "fraction_satisfied": at_alpha.fraction_satisfied,
        "satisfied": list(at_alpha.satisfied),
        "is_monotone": monotone.is_monotone,
        "largest_increase": monotone.largest_increase,
    }


# ---- part (a): MiniLM on rt-sentences ----------------------------------------------------


def text_model(seed: int, layers: int | None) -> HFEncoder:
    """MiniLM-L6 (or its first ``layers`` layers) with a fresh mean-pooled 2-class head."""
    from transformers.utils import logging as hf_logging

    seed_everything(seed)
    options: dict[str, Any] = {} if layers is None else {"num_hidden_layers": layers}
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # a cut model's unused layers are expected, not news
    hf_logging.disable_progress_bar()  # one bar per run of a study is noise
    try:
        model = HFEncoder.from_pretrained(
            minilm_path(), num_outputs=2, pooling="mean", attn_implementation="sdpa", **options
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    return model.train()


def robustness(
    model: nn.Module,
    test: Any,
    levels: Mapping[str, Sequence[float]],
    skip_token_ids: Sequence[int],
    seed: int,
) -> dict[str, Any]:
    """Clean test accuracy and accuracy under each perturbation kind at each level.

    The perturbation generator is seeded identically for every model, so ERM and
    constrained models see the same noise draws (paired comparison).
    """
    out: dict[str, Any] = {"clean": evaluate(model, test, "classification")["accuracy"]}
    for kind, gammas in levels.items():
        accuracies = []
        for gamma in gammas:
            with perturbed_embeddings(model, kind, gamma, seed=seed, skip_token_ids=skip_token_ids):
                accuracies.append(evaluate(model, test, "classification")["accuracy"])
        out[kind] = accuracies
    return out


# ---- part (b): unrolled Transformer denoiser on street-video patches -----------------------


def video_crops(
    frames: torch.Tensor, count: int, crop: int, patch: int, generator: torch.Generator
) -> torch.Tensor:
    """Random ``crop`` x ``crop`` pixel crops as tokens of ``patch`` x ``patch`` pixels.

    Args:
        frames: uint8 ``[F, H, W]`` gray frames.
        count: how many crops.
        crop: crop side in pixels (a multiple of ``patch``).
        patch: token side in pixels.
        generator: the random source.

    Returns:
        float ``[count, (crop / patch) ** 2, patch * patch]`` in [0, 1].
    """
    if crop % patch:
        raise ValueError(f"crop {crop} must be a multiple of the patch size {patch}")
    number, height, width = frames.shape
    f = torch.randint(0, number, (count,), generator=generator)
    y = torch.randint(0, height - crop + 1, (count,), generator=generator)
    x = torch.randint(0, width - crop + 1, (count,), generator=generator)
    rows = y[:, None] + torch.arange(crop)
    cols = x[:, None] + torch.arange(crop)
    pixels = frames[f[:, None, None], rows[:, :, None], cols[:, None, :]].float() / 255.0
    side = crop // patch
    tokens = pixels.reshape(count, side, patch, side, patch).permute(0, 1, 3, 2, 4)
    return tokens.reshape(count, side * side, patch * patch)


def noisy_pairs(clean: torch.Tensor, sigma: float, seed: int) -> DictDataset:
    """``{"inputs": clean + sigma * noise, "labels": clean}`` with seeded Gaussian noise."""
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(seed))
    return DictDataset({"inputs": clean + sigma * noise, "labels": clean})


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


def denoising_rmse(
    model: nn.Module, clean: torch.Tensor, sigmas: Sequence[float], seed: int
) -> list[float]:
    """Test RMSE (pixels in [0, 1]) at each noise level, same noise draws for every model."""
    return [
        evaluate(model, noisy_pairs(clean, sigma, seed + index), "regression")["rmse"]
        for index, sigma in enumerate(sigmas)
    ]
