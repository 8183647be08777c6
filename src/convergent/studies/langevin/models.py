"""The ``langevin`` study's data and models: generated Darcy flow cut into patches, the
single-head ViT-style regressor, phase 1 (AdamW on every parameter) and the phase-2 copy in
which only the targeted matrices train."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from convergent.data import DictDataset, load_splits, to_patches
from convergent.models import Transformer, TransformerConfig, add_query_key_lora
from convergent.regularize import Penalty, VillaniRegularizer
from convergent.train import evaluate, fit

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
