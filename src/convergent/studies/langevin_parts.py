"""The runs of the ``langevin`` study: data, models, phase 1, one phase-2 run."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from convergent.data import load_splits, to_patches
from convergent.data.splits import DictDataset
from convergent.diagnostics import flat_potential, villani_along_ray
from convergent.losses import task_loss
from convergent.models import Transformer, TransformerConfig
from convergent.models.lora import add_query_key_lora
from convergent.optim.langevin import Langevin
from convergent.regularize import (
    Penalty,
    VillaniRegularizer,
    lam_for_stationary_radius,
    radial_relaxation_time,
    stationary_radius,
)
from convergent.train import RegularizedStep, evaluate, fit

# Generated Darcy flow (darcy-gen): one pool for every regime and seed. The pool's training
# part is 9 x the validation set (the loader holds out a tenth); a regime trains on its first
# ``train_fields``; the test fields are generated with POOL_SEED + 1.
POOL_SEED = 100


@dataclass(frozen=True)
class DarcyData:
    """The splits of one regime, labels as [N, patches, values per patch] in input order."""

    train: DictDataset
    validation: DictDataset
    test: DictDataset
    labels_std: float  # raw units = standardized units x labels_std


def darcy_pool(train_fields: int, validation_fields: int, test_fields: int) -> DarcyData:
    """The first ``train_fields`` training fields of the pool, its validation and test sets.

    RMSE and relative L2 error do not depend on the order of a field's values, so labels are
    cut into the patches the model reads and compared with its per-token outputs.
    """
    splits = load_splits(
        "darcy-gen", seed=POOL_SEED, train_size=10 * validation_fields, test_size=test_fields
    )
    patch, resolution = int(splits.info["patch"]), int(splits.info["resolution"])

    def reorder(dataset: DictDataset) -> DictDataset:
        labels = dataset.tensors["labels"].view(-1, resolution, resolution)
        return DictDataset(
            {"inputs": dataset.tensors["inputs"], "labels": to_patches(labels, patch)}
        )

    if not 1 <= train_fields <= len(splits.train):
        raise ValueError(
            f"train_fields={train_fields} is out of range; allowed range is [1, "
            f"{len(splits.train)}] (9 x validation_fields)."
        )
    train = reorder(splits.train).subset(torch.arange(train_fields))
    return DarcyData(
        train, reorder(splits.validation), reorder(splits.test), float(splits.info["labels_std"])
    )


def build_model(n_layers: int, d_model: int, tokens: int, features: int, seed: int) -> Transformer:
    """The single-head ViT-style regressor: one output of `features` values per patch."""
    torch.manual_seed(seed)
    config = TransformerConfig(
        task="regression",
        input_dim=features,
        num_outputs=features,
        pooling="token",
        max_len=tokens,
        d_model=d_model,
        n_heads=1,
        n_layers=n_layers,
    )
    return Transformer(config)


def pretrain(
    model: nn.Module, train: DictDataset, steps: int, lr: float, batch_size: int, seed: int
) -> None:
    """Phase 1: every parameter, AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    fit(
        model,
        optimizer,
        train,
        max_steps=steps,
        batch_size=min(batch_size, len(train)),
        task="regression",
        seed=seed,
        progress=False,
        tensorboard=False,
    )


def pretrained_model(
    experiment: str, data: DarcyData, d_model: int, settings: dict[str, Any], seed: int
) -> Transformer:
    """Phase 1 for ``experiment`` ("attention": one layer; "lora": ``lora_layers``)."""
    tokens, features = data.train.tensors["inputs"].shape[1:]
    layers = 1 if experiment == "attention" else int(settings["lora_layers"])
    model = build_model(layers, d_model, int(tokens), int(features), seed)
    pretrain(
        model,
        data.train,
        settings["pretrain_steps"],
        settings["pretrain_lr"],
        settings["pretrain_batch_size"],
        seed,
    )
    return model


def scores(model: nn.Module, data: DarcyData) -> dict[str, float]:
    """Train, validation and test RMSE (standardized units) and the training MSE."""
    train = evaluate(model, data.train, "regression")
    return {
        "train_rmse": float(train["rmse"]),
        "train_mse": float(train["rmse"]) ** 2,
        "validation_rmse": float(evaluate(model, data.validation, "regression")["rmse"]),
        "test_rmse": float(evaluate(model, data.test, "regression")["rmse"]),
    }


def gradient_rms(parameters: Iterable[torch.Tensor]) -> float:
    """sqrt(mean of grad^2) over every entry of the parameters that have a gradient."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    count = sum(g.numel() for g in grads)
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads) / count) if count else 0.0


class _Tracker:
    """A `fit` callback: every `every` steps, each targeted matrix's norm, the three RMSEs and
    the gradient RMS of the step just taken (the noise check's denominator)."""

    def __init__(
        self, model: nn.Module, regularizer: VillaniRegularizer, data: DarcyData, every: int
    ):
        self.model, self.regularizer, self.data, self.every = model, regularizer, data, every
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.records: list[dict[str, Any]] = []
        self.record(0, None)  # before any step there is no gradient

    def record(self, step: int, grad_rms: float | None) -> None:
        measured = scores(self.model, self.data)
        self.records.append(
            {
                "step": step,
                "norms": self.regularizer.norms(),
                "train_rmse": measured["train_rmse"],
                "validation_rmse": measured["validation_rmse"],
                "test_rmse": measured["test_rmse"],
                "gap": measured["test_rmse"] - measured["train_rmse"],
                "grad_rms": grad_rms,
            }
        )

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every == 0:
            # `fit` zeroes gradients at the start of the next step: they are still this step's
            # (loss + regularizer on the batch), exactly what the Langevin step used.
            self.record(step, gradient_rms(self.trainable))


def phase2_model(experiment: str, base: Transformer, lora_rank: int, seed: int) -> nn.Module:
    """A copy of the pre-trained model with only the phase-2 parameters trainable."""
    tokens, features = base.config.max_len, base.config.input_dim or 0
    model = build_model(base.config.n_layers, base.config.d_model, tokens, features, seed)
    model.load_state_dict(base.state_dict())
    if experiment == "lora":
        torch.manual_seed(seed)  # PEFT draws A at random
        return add_query_key_lora(model, rank=lora_rank)  # freezes everything else
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith(("q_proj.weight", "k_proj.weight")))
    return model


def targeted(experiment: str, model: nn.Module, kind: Penalty, eps: float) -> VillaniRegularizer:
    """The regularizer over the phase-2 matrices, at lam 0 (set it after)."""
    targets = "query_key" if experiment == "attention" else "lora"
    return VillaniRegularizer(model, targets, kind, lam=0.0, eps=eps)


def radius_lam(
    kind: Penalty, weights: list[torch.Tensor], factor: float, s: float, eps: float
) -> float:
    """lam of the radius rule: the penalty alone (flat loss) at diffusion ``s`` puts the mode
    of each ||W||_F at ``factor`` x the root-mean-square start norm of the matrices (all-zero
    ones, like LoRA's B, left out of the norm); averaged over the matrices."""
    squared = [float(w.detach().pow(2).sum()) for w in weights]
    nonzero = [value for value in squared if value > 0]
    radius = factor * math.sqrt(sum(nonzero) / len(nonzero))
    lams = [lam_for_stationary_radius(kind, radius, w.numel(), s, eps) for w in weights]
    return sum(lams) / len(lams)


def theory(
    kind: Penalty, lam: float, numel: dict[str, int], s: float, lr: float, eps: float
) -> tuple[dict[str, float], float]:
    """(stationary radius per matrix, the longest radial relaxation time in steps); inf and
    NaN where there is no penalty or no noise."""
    if lam <= 0 or s <= 0:
        return {name: math.inf for name in numel}, math.nan
    radii = {name: stationary_radius(kind, lam, n, s, eps) for name, n in numel.items()}
    longest = max(radial_relaxation_time(kind, lam, n, s, eps) for n in numel.values())
    return radii, longest / lr


def langevin_run(
    experiment: str,
    base: Transformer,
    data: DarcyData,
    *,
    kind: Penalty,
    lam: float,
    s: float,
    steps: int,
    settings: dict[str, Any],
    seed: int,
) -> tuple[nn.Module, VillaniRegularizer, list[dict[str, Any]]]:
    """Phase 2: only W_Q, W_K (or the LoRA factors) move, by Langevin at diffusion ``s`` on
    loss + lam x penalty. Returns the model, its regularizer and the trace."""
    model = phase2_model(experiment, base, int(settings["lora_rank"]), seed)
    regularizer = targeted(experiment, model, kind, float(settings["power_eps"]))
    regularizer.lam = lam
    tracker = _Tracker(model, regularizer, data, int(settings["record_every"]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    fit(
        model,
        Langevin(trainable, lr=float(settings["langevin_lr"]), s=s, seed=seed),
        data.train,
        max_steps=steps,
        batch_size=min(int(settings["langevin_batch_size"]), len(data.train)),
        task="regression",
        training_step=RegularizedStep("regression", regularizer),
        seed=seed,
        callbacks=[tracker],
        progress=False,
        tensorboard=False,
    )
    return model, regularizer, tracker.records


def villani_rows(
    model: nn.Module,
    regularizer: VillaniRegularizer,
    train: DictDataset,
    radii: tuple[float, ...],
    s: float,
    probes: int,
    examples: int,
    seed: int,
) -> list[dict[str, float]]:
    """The Villani quantity along the ray through the current targeted weights."""
    targets = {name: p for name, p in model.named_parameters() if name in regularizer.parameters}
    batch = {key: value[:examples] for key, value in train.tensors.items()}

    def objective(values: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = torch.func.functional_call(
            model, values, kwargs={"inputs": batch["inputs"]}
        ).logits
        return task_loss(logits, batch["labels"], "regression") + regularizer(values)

    potential = flat_potential(objective, {name: p.shape for name, p in targets.items()})
    point = torch.cat([p.detach().flatten() for p in targets.values()])
    scale = float(point.norm())
    generator = torch.Generator().manual_seed(seed)
    return villani_along_ray(
        potential, point, [r * scale for r in radii], s, probes=probes, generator=generator
    )
