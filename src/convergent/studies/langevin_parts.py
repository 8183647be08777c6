"""The runs of the ``langevin`` study: data, models, pretraining, the Langevin phase."""

from __future__ import annotations

import math
from collections.abc import Iterable
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
    penalty,
    stationary_radius,
)
from convergent.studies.langevin_config import Config
from convergent.train import RegularizedStep, evaluate, fit


def patch_ordered_splits(train_examples: int | None) -> tuple[DictDataset, DictDataset]:
    """darcy-16 with labels as [N, 16 patches, 16 values], in the order of the input patches.

    RMSE and relative L2 error do not depend on the order of the 256 values, so the model's
    per-token outputs ([B, 16, 16]) are compared with the field cut into the same patches.
    """
    splits = load_splits("darcy-16")
    patch = int(splits.info["patch"])
    resolution = int(splits.info["resolution"])

    def reorder(dataset: DictDataset) -> DictDataset:
        labels = dataset.tensors["labels"].view(-1, resolution, resolution)
        return DictDataset(
            {"inputs": dataset.tensors["inputs"], "labels": to_patches(labels, patch)}
        )

    train = reorder(splits.train)
    if train_examples is not None:
        train = train.subset(torch.arange(min(train_examples, len(train))))
    return train, reorder(splits.test)


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
        batch_size=batch_size,
        task="regression",
        seed=seed,
        progress=False,
        tensorboard=False,
    )


def gradient_rms(parameters: Iterable[torch.Tensor]) -> float:
    """sqrt(mean of grad^2) over every entry of the parameters that have a gradient."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    count = sum(g.numel() for g in grads)
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads) / count) if count else 0.0


class _Tracker:
    """A `fit` callback: every `every` steps, norms, train/test scores and the gradient RMS of
    the step just taken (the noise check's denominator) into `records`."""

    def __init__(
        self, model: nn.Module, norms: Any, train: DictDataset, test: DictDataset, every: int
    ):
        self.model, self.norms, self.train, self.test, self.every = model, norms, train, test, every
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.records: list[dict[str, float | None]] = []
        self.record(0, None)  # before any step there is no gradient

    def record(self, step: int, grad_rms: float | None) -> None:
        train_scores = evaluate(self.model, self.train, "regression")
        test_scores = evaluate(self.model, self.test, "regression")
        self.records.append(
            {
                "step": step,
                **self.norms(),
                "train_rmse": train_scores["rmse"],
                "test_rmse": test_scores["rmse"],
                "train_relative_l2": train_scores["relative_l2"],
                "test_relative_l2": test_scores["relative_l2"],
                "gap": test_scores["rmse"] - train_scores["rmse"],
                "grad_rms": grad_rms,
            }
        )

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every == 0:
            # `fit` zeroes gradients at the start of the next step: they are still this step's
            # (loss + regularizer on the batch), exactly what the Langevin step used.
            self.record(step, gradient_rms(self.trainable))


def _total_norm(weights: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(w.detach().pow(2).sum()) for w in weights))


def _norm_reader(regularizer: VillaniRegularizer, groups: dict[str, str]) -> Any:
    """norms() -> {group: ||all matched matrices||_F}, with groups {label: name substring}."""

    def read() -> dict[str, float]:
        weights = regularizer.weights()
        return {
            label: _total_norm([w for n, w in weights.items() if key in n])
            for label, key in groups.items()
        }

    return read


def choose_lam(
    kind: Penalty,
    weights: list[torch.Tensor],
    *,
    rule: str,
    s: float,
    eps: float,
    radius_factor: float,
    penalty_fraction: float,
    train_loss: float,
) -> tuple[float, float]:
    """(lam, target radius) for `rule`, from the targeted matrices at the start of phase 2.

    "radius": the penalty alone (flat loss) puts the mode of each ||W||_F at `radius_factor`
    times the root-mean-square start norm of the targeted matrices (all-zero ones, like
    LoRA's B, excluded); lam is averaged over the matrices. "loss_fraction": the penalty at
    the start is `penalty_fraction` of `train_loss` (the radius is then reported as 0).
    """
    if rule == "loss_fraction":
        unit = sum(float(penalty(w.detach(), kind, 1.0, eps)) for w in weights)
        return (penalty_fraction * train_loss / unit if unit > 0 else 0.0), 0.0
    if rule != "radius":
        raise ValueError(f"lam_rule must be 'radius' or 'loss_fraction', got {rule!r}.")
    squared = [float(w.detach().pow(2).sum()) for w in weights]
    nonzero = [value for value in squared if value > 0]
    radius = radius_factor * math.sqrt(sum(nonzero) / len(nonzero))
    lams = [lam_for_stationary_radius(kind, radius, w.numel(), s, eps) for w in weights]
    return sum(lams) / len(lams), radius


def langevin_phase(
    model: nn.Module,
    regularizer: VillaniRegularizer,
    tracker: _Tracker,
    train: DictDataset,
    *,
    steps: int,
    lr: float,
    s: float,
    batch_size: int,
    seed: int,
) -> None:
    """Phase 2: only the trainable parameters (W_Q, W_K or LoRA factors) move, by Langevin."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = Langevin(trainable, lr=lr, s=s, seed=seed)
    fit(
        model,
        optimizer,
        train,
        max_steps=steps,
        batch_size=min(batch_size, len(train)),
        task="regression",
        training_step=RegularizedStep("regression", regularizer),
        seed=seed,
        callbacks=[tracker],
        progress=False,
        tensorboard=False,
    )


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


def _prepare(experiment: str, base: Transformer, config: Config, seed: int) -> nn.Module:
    """A copy of the pre-trained model with only the phase-2 parameters trainable."""
    tokens, features = base.config.max_len, base.config.input_dim or 0
    model = build_model(base.config.n_layers, config.d_model, tokens, features, seed)
    model.load_state_dict(base.state_dict())
    if experiment == "lora":
        torch.manual_seed(seed)  # PEFT draws A at random
        return add_query_key_lora(model, rank=config.lora_rank)  # freezes everything else
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith(("q_proj.weight", "k_proj.weight")))
    return model


def run_experiment(
    experiment: str, config: Config, seed: int, train: DictDataset, test: DictDataset, s: float
) -> dict[str, Any]:
    """Phase 1 once, then phase 2 from the same weights for each variant.

    experiment "attention": one layer, W_Q and W_K train; "lora": `lora_layers` layers, the
    PEFT LoRA factors on q/k train. Returns only numbers, strings, lists and dicts (a unit of
    the cache; `stationary_radius` is inf without a penalty).
    """
    tokens, features = train.tensors["inputs"].shape[1:]
    layers = 1 if experiment == "attention" else config.lora_layers
    base = build_model(layers, config.d_model, tokens, features, seed)
    pretrain(
        base, train, config.pretrain_steps, config.pretrain_lr, config.pretrain_batch_size, seed
    )
    out: dict[str, Any] = {
        "pretrained_test": evaluate(base, test, "regression"),
        "traces": {},
        "lam": {},
        "target_radius": {},
        "stationary_radius": {},
        "villani": {},
    }
    targets = "query_key" if experiment == "attention" else "lora"
    groups = (
        {"query": "q_proj", "key": "k_proj"}
        if experiment == "attention"
        else {"lora_A": ".lora_A.", "lora_B": ".lora_B."}
    )
    train_loss = evaluate(base, train, "regression")["loss"]
    for variant in config.variants:
        model = _prepare(experiment, base, config, seed)
        kind: Penalty = "power" if variant == "power" else "log"
        regularizer = VillaniRegularizer(model, targets, kind, lam=0.0, eps=config.power_eps)
        lam, radius = (
            (0.0, 0.0)
            if variant == "none"
            else choose_lam(
                kind,
                list(regularizer.weights().values()),
                rule=config.lam_rule,
                s=s,
                eps=config.power_eps,
                radius_factor=config.radius_factor,
                penalty_fraction=config.penalty_fraction,
                train_loss=train_loss,
            )
        )
        regularizer.lam = lam
        reader = _norm_reader(regularizer, groups)
        if experiment == "lora":
            products = VillaniRegularizer(model, penalty=kind, lam=0.0, product=True)

            def reader(
                plain: Any = reader, products: VillaniRegularizer = products
            ) -> dict[str, float]:
                return {**plain(), "lora_BA": _total_norm(list(products.weights().values()))}

        tracker = _Tracker(model, reader, train, test, config.record_every)
        langevin_phase(
            model,
            regularizer,
            tracker,
            train,
            steps=config.langevin_steps,
            lr=config.langevin_lr,
            s=s,
            batch_size=config.langevin_batch_size,
            seed=seed,
        )
        numel = next(iter(regularizer.weights().values())).numel()
        stationary = float(stationary_radius(kind, lam, numel, s, config.power_eps))  # inf: none
        for key, value in (
            ("traces", tracker.records),
            ("lam", lam),
            ("target_radius", radius),
            ("stationary_radius", stationary),
        ):
            out[key][variant] = value
        if experiment == "attention":
            out["villani"][variant] = villani_rows(
                model,
                regularizer,
                train,
                config.villani_radii,
                s,
                config.villani_probes,
                config.villani_examples,
                seed,
            )
    return out
