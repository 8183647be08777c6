"""The configuration of ``convergent train`` and what it builds: splits options, the model,
the optimizer's options and the sparse-training step. The only place that parses a training
config."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from convergent.data import Splits, is_token_source, minilm_path
from convergent.models import HFEncoder, Transformer, TransformerConfig
from convergent.optim import posterior_s
from convergent.sparse import ACDCSchedule, GradualSchedule, MaskSpec
from convergent.train.masked import MaskedStep
from convergent.train.schedules import SCHEDULES
from convergent.train.steps import TrainingStep

MODELS = ("transformer", "minilm")
OPTIMIZER_CHOICES = ("adamw", "sgd", "horst", "ham", "langevin")
PENALTY_CHOICES = ("log", "power")
# Sparse training's schedules, and the names the summary and the checks give them.
SPARSITY_SCHEDULES = {"acdc": "AC/DC", "gmp": "GMP", "fixed": "fixed masks"}


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``convergent train`` needs; each field can come from a JSON file or a flag.

    Attributes:
        data: a data source name (``convergent data list``) or ``hf:NAME``.
        model: ``"transformer"`` (ours, from scratch) or ``"minilm"`` (MiniLM-L6 fine-tuned;
            token data only).
        steps: optimizer steps.
        batch_size: global batch size.
        lr: peak learning rate.
        weight_decay: decoupled weight decay.
        optimizer: ``"adamw"``, ``"sgd"`` (momentum 0.9), ``"horst"`` (AdamW step, then the
            hyperbolic mirror step), ``"ham"`` (AdamW wrapped by HAM) or ``"langevin"``
            (gradient steps plus Gaussian noise on every trained weight).
        horst_strength: HORST's first-step mirror/Adam move ratio, > 0 (alpha = strength /
            mean |theta| per group); horst_alpha: the paper's alpha instead; give at most one
            (neither: :class:`~convergent.optim.HORST`'s default strength).
        horst_beta: HORST's L1 shrinkage, >= 0 (None: HORST's default).
        ham_alpha, ham_beta: HAM's mirror strength and decay, >= 0 (None: the defaults of
            :class:`~convergent.optim.HAM`).
        langevin_s: Langevin's diffusion coefficient s, >= 0; or langevin_temperature: s as a
            multiple T of the training set's posterior (`convergent.optim.posterior_s`: 2 / N
            for cross-entropy tasks, 4 sigma^2 / (N K) for regression with sigma^2 =
            langevin_noise_variance). Give one of the two with ``optimizer="langevin"``.
        langevin_noise_variance: sigma^2 of a regression posterior, in the loss's units.
        villani_target: add a Villani regularizer on these weights (a preset of
            :func:`~convergent.regularize.select_parameters`, e.g. ``"query_key"``, or a
            pattern); villani_penalty ``"log"`` or ``"power"``; villani_lam its strength.
        schedule: ``"constant"``, ``"linear"`` or ``"cosine"`` decay after warm-up.
        warmup_fraction: fraction of ``steps`` spent warming up, in [0, 1].
        grad_clip: max gradient norm (0 turns clipping off).
        seed: seeds the model, the data order and the split.
        max_length: tokens per text example.
        d_model, n_layers, n_heads, d_ff, dropout, beta, norm: our Transformer's shape.
        pooling: ``"cls"`` or ``"mean"`` for classification and regression heads.
        precision: ``"fp32"`` or ``"bf16"`` (or ``"fp16"`` on CUDA).
        eval_every: validation every this many steps (0: only at the end).
        checkpoint_every: checkpoint every this many steps (0: only at the end).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        sparsity: train sparse: the share of the prunable weights held at zero, in [0, 1)
            (None or 0: dense).
        sparsity_schedule: ``"acdc"`` (AC/DC's phases over ``steps``), ``"gmp"`` (gradual
            magnitude pruning, :meth:`~convergent.sparse.GradualSchedule.over_run`) or
            ``"fixed"`` (magnitude masks of the initial weights, kept throughout).
        mask_spec: which weights are prunable and how the masks are laid out
            (:class:`~convergent.sparse.MaskSpec`; a dict of its fields in JSON). An N:M
            pattern prunes 1 - N/M, so ``sparsity`` must be that.
    """

    data: str = "rt-sentences"
    model: str = "minilm"
    steps: int = 250
    batch_size: int = 32
    lr: float = 5e-5
    weight_decay: float = 0.01
    optimizer: str = "adamw"
    horst_strength: float | None = None
    horst_alpha: float | None = None
    horst_beta: float | None = None
    ham_alpha: float | None = None
    ham_beta: float | None = None
    langevin_s: float | None = None
    langevin_temperature: float | None = None
    langevin_noise_variance: float | None = None
    villani_target: str | None = None
    villani_penalty: str = "log"
    villani_lam: float = 1e-3
    schedule: str = "linear"
    warmup_fraction: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    max_length: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.1
    beta: float = 1.0
    norm: str = "pre"
    pooling: str = "mean"
    precision: str = "fp32"
    eval_every: int = 50
    checkpoint_every: int = 0
    device: str = "auto"
    sparsity: float | None = None
    sparsity_schedule: str = "acdc"
    mask_spec: MaskSpec = dataclasses.field(default_factory=MaskSpec)

    def __post_init__(self) -> None:
        _choice("model", self.model, MODELS)
        _choice("optimizer", self.optimizer, OPTIMIZER_CHOICES)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("device", self.device, ("auto", "cpu", "cuda"))
        for name in ("steps", "batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"{name} must be a non-negative integer, got {getattr(self, name)}"
                )
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        for name in (
            "weight_decay",
            "horst_alpha",
            "horst_beta",
            "ham_alpha",
            "ham_beta",
            "langevin_s",
            "langevin_temperature",
            "villani_lam",
        ):
            if (getattr(self, name) or 0.0) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        if self.horst_strength is not None and not self.horst_strength > 0:
            raise ValueError(f"horst_strength must be positive, got {self.horst_strength}")
        if self.horst_strength is not None and self.horst_alpha is not None:
            raise ValueError(
                f"give horst_strength or horst_alpha, not both; got {self.horst_strength} and "
                f"{self.horst_alpha}"
            )
        if self.langevin_noise_variance is not None and not self.langevin_noise_variance > 0:
            raise ValueError(
                f"langevin_noise_variance must be positive, got {self.langevin_noise_variance}"
            )
        if self.optimizer == "langevin" and (self.langevin_s is None) == (
            self.langevin_temperature is None
        ):
            raise ValueError(
                "optimizer 'langevin' needs exactly one of langevin_s (the diffusion "
                "coefficient) and langevin_temperature (a multiple of the posterior's s), got "
                f"langevin_s={self.langevin_s} and langevin_temperature={self.langevin_temperature}"
            )
        _choice("villani_penalty", self.villani_penalty, PENALTY_CHOICES)
        if not 0 <= self.warmup_fraction <= 1:
            raise ValueError(f"warmup_fraction must be in [0, 1], got {self.warmup_fraction}")
        if self.grad_clip < 0:
            raise ValueError(
                f"grad_clip must be non-negative (0 turns it off), got {self.grad_clip}"
            )
        self._check_sparsity()

    @property
    def sparse(self) -> bool:
        """Whether the run trains sparse (a sparsity above 0)."""
        return bool(self.sparsity)

    def _check_sparsity(self) -> None:
        if self.mask_spec is None or isinstance(self.mask_spec, dict):  # e.g. from JSON
            object.__setattr__(self, "mask_spec", MaskSpec.from_dict(self.mask_spec or {}))
        _choice("sparsity_schedule", self.sparsity_schedule, tuple(SPARSITY_SCHEDULES))
        if self.sparsity is not None and not 0 <= self.sparsity < 1:
            raise ValueError(f"sparsity must be in [0, 1) (0 or None: dense), got {self.sparsity}")
        if not self.sparse:
            changed = _changed_sparsity_settings(self)
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} {'apply' if len(changed) > 1 else 'applies'} to sparse"
                    f" training only; set sparsity in (0, 1), got {self.sparsity}"
                )
            return
        shape = self.mask_spec.n_m
        if shape is not None:
            pattern = self.mask_spec.pattern
            if self.sparsity_schedule == "gmp":
                raise ValueError(
                    f"sparsity_schedule 'gmp' ramps an unstructured sparsity; pattern {pattern!r}"
                    " takes acdc or fixed"
                )
            implied = 1 - shape[0] / shape[1]
            if not math.isclose(float(self.sparsity or 0), implied, abs_tol=1e-9):
                raise ValueError(
                    f"pattern {pattern!r} prunes 1 - N/M = {implied:g} of the weights, so "
                    f"sparsity must be {implied:g}, got {self.sparsity}"
                )
        mask_schedule(self)  # its own checks (GMP needs a run of 2 steps or more)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a dict (e.g. a JSON file), rejecting keys that are not fields."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; the keys are {sorted(known)}")
        return cls(**values)


def _changed_sparsity_settings(config: TrainConfig) -> list[str]:
    """The sparse-training settings of ``config`` that differ from their defaults, as
    ``"name value"``."""
    changed = []
    default_schedule = TrainConfig.__dataclass_fields__["sparsity_schedule"].default
    if config.sparsity_schedule != default_schedule:
        changed.append(f"sparsity_schedule {config.sparsity_schedule!r}")
    default_spec = MaskSpec()
    for field in dataclasses.fields(MaskSpec):
        value = getattr(config.mask_spec, field.name)
        if value != getattr(default_spec, field.name):
            changed.append(f"mask_spec {field.name} {value!r}")
    return changed


def mask_schedule(config: TrainConfig) -> ACDCSchedule | GradualSchedule | None:
    """The :class:`~convergent.train.MaskedStep` schedule of a sparse config: AC/DC over its
    steps, the default GMP of a run of its steps, or None (fixed masks)."""
    if config.sparsity_schedule == "acdc":
        return ACDCSchedule(config.steps)
    if config.sparsity_schedule == "gmp":
        return GradualSchedule.over_run(config.steps, float(config.sparsity or 0))
    return None


def build_masked_step(
    config: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer, base: TrainingStep
) -> MaskedStep:
    """The sparse-training step of a sparse ``config`` around the objective ``base``: masks
    over ``config.mask_spec``'s selection of ``model`` (unwrapped), on ``config``'s schedule."""
    selection = config.mask_spec.select(model)
    return MaskedStep(
        base,
        optimizer,
        selection.names,
        sparsity=float(config.sparsity or 0),
        schedule=mask_schedule(config),
        spec=config.mask_spec,
        input_dims=selection.input_dims,
    )


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def split_options(data_name: str, max_length: int) -> dict[str, Any]:
    """The options :func:`~convergent.data.load_splits` takes for ``data_name``: text sources
    take the run's ``max_length``."""
    return {"max_length": max_length} if is_token_source(data_name) else {}


def check_device(device: str) -> None:
    """Refuse ``"cuda"`` where this PyTorch build or machine has no CUDA device."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device 'cuda' was asked for, but this PyTorch build sees no CUDA device; "
            "pass --device cpu or --device auto"
        )


def build_model(config: TrainConfig, splits: Splits) -> nn.Module:
    """Our Transformer sized for ``splits``, or MiniLM-L6 with a new head."""
    if config.model == "minilm":
        if splits.vocab_size is None:
            raise ValueError(f"model 'minilm' needs text data, and {config.data!r} is not text")
        return HFEncoder.from_pretrained(
            minilm_path(),
            task=splits.task,
            num_outputs=splits.num_outputs,
            pooling=config.pooling,
            attn_implementation="sdpa",  # training needs no attention weights; sdpa is faster
        )
    return Transformer(
        TransformerConfig(
            task=splits.task,  # type: ignore[arg-type]
            num_outputs=splits.num_outputs,
            vocab_size=splits.vocab_size,
            input_dim=splits.input_dim,
            max_len=splits.seq_len,
            d_model=config.d_model,
            n_heads=config.n_heads,
            n_layers=config.n_layers,
            d_ff=config.d_ff,
            dropout=config.dropout,
            beta=config.beta,
            norm=config.norm,  # type: ignore[arg-type]
            pooling=config.pooling if splits.task != "lm" else "cls",  # type: ignore[arg-type]
            causal=splits.task == "lm",
        )
    )


def optimizer_options(config: TrainConfig, splits: Splits | None = None) -> dict[str, Any]:
    """The options :func:`~convergent.optim.build_optimizer` gets beyond the param groups:
    the learning rate, momentum 0.9 for SGD, the mirror strengths that were set, and
    Langevin's s (from ``splits`` when given as a temperature) and seed."""
    options: dict[str, Any] = {"lr": config.lr}
    if config.optimizer == "sgd":
        options["momentum"] = 0.9
    mirror = {
        "horst": {
            "alpha": config.horst_alpha,
            "strength": config.horst_strength,
            "beta": config.horst_beta,
        },
        "ham": {"alpha": config.ham_alpha, "beta": config.ham_beta},
    }.get(config.optimizer, {})
    options.update({key: value for key, value in mirror.items() if value is not None})
    if config.optimizer == "langevin":
        options["seed"] = config.seed
        options["s"] = langevin_s(config, splits)
    return options


def langevin_s(config: TrainConfig, splits: Splits | None) -> float:
    """``langevin_s``, or ``langevin_temperature`` times the posterior's s of ``splits``' train
    split (`convergent.optim.posterior_s`)."""
    if config.langevin_s is not None:
        return float(config.langevin_s)
    if splits is None or config.langevin_temperature is None:
        raise ValueError("langevin_temperature needs the training data to set s")
    examples = len(splits.train)
    if splits.task == "regression":
        if config.langevin_noise_variance is None:
            raise ValueError(
                "langevin_temperature on a regression task needs langevin_noise_variance "
                "(sigma^2 of the posterior, in the loss's units, > 0)"
            )
        posterior = posterior_s(examples, splits.num_outputs or 1, config.langevin_noise_variance)
    else:
        posterior = posterior_s(examples)
    return float(config.langevin_temperature) * posterior
