"""The ``convergent train`` recipe: a frozen config in, a run folder out.

This is an entry point in the torchtune sense: the config object stops here, and everything
below it (data loaders, models, :func:`~convergent.train.loop.fit`) takes plain arguments.
A run folder holds ``config.json``, ``metrics.jsonl``, ``tensorboard/``, ``checkpoints/``,
``summary.json`` and ``loss_curve.png``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data import Splits, load_splits, minilm_path
from ..models import HFEncoder, Transformer, TransformerConfig
from ..optim import HAM, HORST
from ..report import plot_training_curves
from . import distributed
from .checkpoint import write_text_atomically
from .loop import evaluate, fit
from .metrics import read_metrics
from .reproducibility import seed_everything
from .schedules import SCHEDULES, warmup_schedule

logger = logging.getLogger(__name__)

MODELS = ("transformer", "minilm")
OPTIMIZERS = ("adamw", "sgd", "horst", "ham")


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
        horst_alpha, horst_beta: HORST's mirror strength and L1 shrinkage, >= 0.
        ham_alpha, ham_beta: HAM's mirror strength and decay, >= 0.
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
    horst_alpha: float = 1.0
    horst_beta: float = 0.0
    ham_alpha: float = 200.0
    ham_beta: float = 1e-3
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
        _choice("optimizer", self.optimizer, OPTIMIZERS)
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
            if getattr(self, name) < 0:
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


def build_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The configured optimizer, with weight decay on matrices only (not biases and norms).

    HORST's and HAM's mirror steps apply to matrices (ndim >= 2), their default.
    """
    decayed = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    plain = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [
        {"params": decayed, "weight_decay": config.weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=0.9)
    if config.optimizer == "horst":
        return HORST(groups, lr=config.lr, alpha=config.horst_alpha, beta=config.horst_beta)
    if config.optimizer == "ham":
        return HAM(torch.optim.AdamW(groups, lr=config.lr), config.ham_alpha, config.ham_beta)
    return torch.optim.AdamW(groups, lr=config.lr)


def run_training(
    config: TrainConfig, run_dir: str | Path, *, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Train, evaluate on validation and test data, and fill ``run_dir``.

    Returns:
        The summary also written to ``summary.json``.
    """
    started = time.perf_counter()
    folder = Path(run_dir)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu")
        if config.device == "auto"
        else config.device
    )
    seed_everything(config.seed)
    options: dict[str, Any] = {}
    if config.data == "rt-sentences" or config.data.startswith("hf:"):
        options["max_length"] = config.max_length
    splits = load_splits(config.data, seed=config.seed, **options)
    model = build_model(config, splits).to(device)
    optimizer = build_optimizer(config, model)
    scheduler = warmup_schedule(
        optimizer,
        total_steps=config.steps,
        warmup_steps=round(config.warmup_fraction * config.steps),
        kind=config.schedule,
    )
    if distributed.is_main_process():
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomically(
            folder / "config.json", json.dumps(dataclasses.asdict(config), indent=2) + "\n"
        )
    parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        "training %s (%.2f M parameters) on %s for %d steps",
        config.model,
        parameters / 1e6,
        config.data,
        config.steps,
    )
    result = fit(
        model,
        optimizer,
        splits.train,
        max_steps=config.steps,
        batch_size=config.batch_size,
        task=splits.task,
        scheduler=scheduler,
        eval_data=splits.validation,
        eval_every=config.eval_every,
        grad_clip=config.grad_clip or None,
        precision=config.precision,
        seed=config.seed,
        run_dir=folder,
        checkpoint_every=config.checkpoint_every or config.steps,
        resume=resume,
        progress=progress,
    )
    test = evaluate(model, splits.test, splits.task, precision=config.precision)
    summary = {
        "data": config.data,
        "model": config.model,
        "task": splits.task,
        "parameters": parameters,
        "steps": result.step,
        "train_loss": result.train_loss,
        "validation": result.evaluation,
        "test": test,
        "seconds": round(time.perf_counter() - started, 1),
        "examples": {
            "train": len(splits.train),
            "validation": len(splits.validation),
            "test": len(splits.test),
        },
    }
    if distributed.is_main_process():
        write_text_atomically(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
        plot_training_curves(
            read_metrics(folder),
            folder / "loss_curve.png",
            title=f"{config.model} on {config.data}",
        )
    return summary
