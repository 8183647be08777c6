"""The configuration of ``convergent train`` and what it builds: splits options, the model
and the optimizer's options. The only place that parses a training config."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data import Splits, is_token_source, minilm_path
from ..models import HFEncoder, Transformer, TransformerConfig
from ..train.schedules import SCHEDULES

MODELS = ("transformer", "minilm")
OPTIMIZER_CHOICES = ("adamw", "sgd", "horst", "ham")


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
            hyperbolic mirror step) or ``"ham"`` (AdamW wrapped by HAM).
        horst_alpha, horst_beta: HORST's mirror strength and L1 shrinkage, >= 0 (None: the
            defaults of :class:`~convergent.optim.HORST`).
        ham_alpha, ham_beta: HAM's mirror strength and decay, >= 0 (None: the defaults of
            :class:`~convergent.optim.HAM`).
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
    """

    data: str = "rt-sentences"
    model: str = "minilm"
    steps: int = 250
    batch_size: int = 32
    lr: float = 5e-5
    weight_decay: float = 0.01
    optimizer: str = "adamw"
    horst_alpha: float | None = None
    horst_beta: float | None = None
    ham_alpha: float | None = None
    ham_beta: float | None = None
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
        for name in ("weight_decay", "horst_alpha", "horst_beta", "ham_alpha", "ham_beta"):
            if (getattr(self, name) or 0.0) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        if not 0 <= self.warmup_fraction <= 1:
            raise ValueError(f"warmup_fraction must be in [0, 1], got {self.warmup_fraction}")
        if self.grad_clip < 0:
            raise ValueError(
                f"grad_clip must be non-negative (0 turns it off), got {self.grad_clip}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a dict (e.g. a JSON file), rejecting keys that are not fields."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; the keys are {sorted(known)}")
        return cls(**values)


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


def optimizer_options(config: TrainConfig) -> dict[str, Any]:
    """The options :func:`~convergent.optim.build_optimizer` gets beyond the param groups:
    the learning rate, momentum 0.9 for SGD, and the mirror strengths that were set."""
    options: dict[str, Any] = {"lr": config.lr}
    if config.optimizer == "sgd":
        options["momentum"] = 0.9
    mirror = {
        "horst": {"alpha": config.horst_alpha, "beta": config.horst_beta},
        "ham": {"alpha": config.ham_alpha, "beta": config.ham_beta},
    }.get(config.optimizer, {})
    options.update({key: value for key, value in mirror.items() if value is not None})
    return options
