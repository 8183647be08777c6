"""The configuration of ``convergent train`` and what it builds: splits options, the model,
the optimizer's options and the sparse-training step. The only place that parses a training
config."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
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
from convergent.wording import did_you_mean, option, unknown_choice

MODELS = ("transformer", "minilm")
# Models that start from pretrained weights (the others train from scratch).
PRETRAINED = ("minilm",)
# The peak learning rate of a run that names none: MiniLM's usual fine-tuning rate, and for
# our Transformer from scratch the best of 3e-4, 1e-3 and 3e-3 on the README's fashion-mnist
# runs in 250 steps (AdamW and HORST; benchmarks/README.md, benchmarks/train_learning_rate.py).
DEFAULT_LEARNING_RATES = {"transformer": 1e-3, "minilm": 5e-5}
# A run that names no checkpoint interval checkpoints about this many times.
CHECKPOINTS_PER_RUN = 10
# The key of config.json that holds sentences about the defaults a run chose (not a field).
NOTES = "notes"
OPTIMIZER_CHOICES = ("adamw", "sgd", "horst", "ham", "langevin")
PENALTY_CHOICES = ("log", "power")
# Sparse training's schedules, and the names the summary and the checks give them.
SPARSITY_SCHEDULES = {"acdc": "AC/DC", "gmp": "GMP", "fixed": "fixed masks"}


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``convergent train`` needs; each field can come from a JSON file or a flag.

    Each attribute's text below is also its flag's ``--help`` (``lr`` is ``--lr``). ``lr``
    and ``checkpoint_every`` left None are set from the run: ``DEFAULT_LEARNING_RATES[model]``
    and ``default_checkpoint_every(steps)``.

    Attributes:
        data: the data source to train on: a name from ``convergent data list``, or
            ``hf:NAME``
        model: ``transformer`` is ours, trained from scratch; ``minilm`` is pretrained
            MiniLM-L6, fine-tuned (text data only).
        steps: optimizer steps to train for.
        batch_size: examples per optimizer step, over all processes.
        lr: peak learning rate; by default a fine-tuning rate for a pretrained model and a
            from-scratch rate for ours.
        weight_decay: decoupled weight decay of the weight matrices.
        optimizer: ``sgd`` has momentum 0.9; ``horst`` takes an AdamW step, then HORST's
            hyperbolic mirror step; ``ham`` wraps AdamW; ``langevin`` takes gradient steps plus
            Gaussian noise on every trained weight.
        horst_strength: HORST's first-step mirror/Adam move ratio, > 0 (alpha = strength /
            mean |theta| per group); give this or HORST's alpha, not both.
        horst_alpha: HORST's alpha as in the paper (its effect scales with |theta|); give
            this or HORST's strength, not both.
        horst_beta: HORST's L1 shrinkage, >= 0.
        ham_alpha: HAM's mirror strength, >= 0.
        ham_beta: HAM's decay, >= 0.
        langevin_s: Langevin's diffusion coefficient s, >= 0; the langevin optimizer takes
            this or Langevin's temperature.
        langevin_temperature: Langevin's s as a multiple of the training set's posterior: 2 / N
            for cross-entropy tasks, 4 sigma^2 / (N K) for regression (with Langevin's noise
            variance).
        langevin_noise_variance: sigma^2 of a regression posterior, in the loss's units.
        villani_target: add a Villani regularizer on these weights: ``query_key``, ``lora``
            or a name pattern.
        villani_penalty: the Villani regularizer's penalty.
        villani_lam: the Villani regularizer's strength, >= 0.
        schedule: how the learning rate decays after warm-up.
        warmup_fraction: the fraction of the steps spent warming the learning rate up, in
            [0, 1].
        grad_clip: the largest gradient norm a step takes (0 turns clipping off).
        seed: seeds the model's initialization, the data order and the split.
        max_length: tokens per text example.
        d_model: our Transformer's width.
        n_layers: our Transformer's number of layers.
        n_heads: our Transformer's attention heads per layer.
        d_ff: our Transformer's feed-forward width.
        dropout: our Transformer's dropout rate.
        beta: our Transformer's residual weight (x + attention becomes beta * x + attention).
        norm: where our Transformer's LayerNorms sit (``none``: no LayerNorm).
        pooling: how a classification or regression head reads a sequence: ``cls`` or
            ``mean`` (its first token, or the mean of its tokens).
        precision: the number format of the forward pass (``fp16``: CUDA only).
        eval_every: score the validation split every this many steps (0: only at the end).
        checkpoint_every: write a checkpoint every this many steps, and at the end (0: only
            at the end); by default about every tenth of the run.
        device: where to train (``auto``: CUDA when there is one).
        sparsity: train sparse: the share of the prunable weights held at zero, in [0, 1)
            (0: dense).
        sparsity_schedule: how sparse training reaches its sparsity: ``acdc`` alternates
            AC/DC's dense and sparse phases over the run, ``gmp`` prunes gradually by
            magnitude, ``fixed`` keeps the initial weights' magnitude masks throughout.
        mask_spec: which weights are prunable and how the masks are laid out
            (:class:`~convergent.sparse.MaskSpec`; a dict of its fields in JSON). An N:M
            pattern prunes 1 - N/M, so ``sparsity`` must be that.
    """

    data: str = "rt-sentences"
    model: str = "minilm"
    steps: int = 250
    batch_size: int = 32
    lr: float | None = None
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
    checkpoint_every: int | None = None
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
                raise ValueError(
                    f"{option(name)} must be a positive integer, got {getattr(self, name)}"
                )
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LEARNING_RATES[self.model])
        if self.checkpoint_every is None:
            object.__setattr__(self, "checkpoint_every", default_checkpoint_every(self.steps))
        for name in ("eval_every", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"{option(name)} must be a non-negative integer, got {getattr(self, name)}"
                )
        if not float(self.lr or 0) > 0:
            raise ValueError(f"{option('lr')} must be positive, got {self.lr}")
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
                raise ValueError(f"{option(name)} must be non-negative, got {getattr(self, name)}")
        if self.horst_strength is not None and not self.horst_strength > 0:
            raise ValueError(
                f"{option('horst_strength')} must be positive, got {self.horst_strength}"
            )
        if self.horst_strength is not None and self.horst_alpha is not None:
            raise ValueError(
                f"give {option('horst_strength')} or {option('horst_alpha')}, not both; got "
                f"{self.horst_strength} and {self.horst_alpha}"
            )
        if self.langevin_noise_variance is not None and not self.langevin_noise_variance > 0:
            raise ValueError(
                f"{option('langevin_noise_variance')} must be positive, got "
                f"{self.langevin_noise_variance}"
            )
        if self.optimizer == "langevin" and (self.langevin_s is None) == (
            self.langevin_temperature is None
        ):
            raise ValueError(
                f"{option('optimizer', 'langevin')} needs exactly one of {option('langevin_s')}"
                f" (the diffusion coefficient) and {option('langevin_temperature')} (a multiple"
                f" of the posterior's s), got {'neither' if self.langevin_s is None else 'both'}"
            )
        _choice("villani_penalty", self.villani_penalty, PENALTY_CHOICES)
        if not 0 <= self.warmup_fraction <= 1:
            raise ValueError(
                f"{option('warmup_fraction')} must be in [0, 1], got {self.warmup_fraction}"
            )
        if self.grad_clip < 0:
            raise ValueError(
                f"{option('grad_clip')} must be non-negative (0 turns it off), got {self.grad_clip}"
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
            raise ValueError(
                f"{option('sparsity')} must be in [0, 1) (0 or None: dense), got {self.sparsity}"
            )
        if not self.sparse:
            changed = _changed_sparsity_settings(self)
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} {'apply' if len(changed) > 1 else 'applies'} to sparse"
                    f" training only; set {option('sparsity')} in (0, 1), got {self.sparsity}"
                )
            return
        shape = self.mask_spec.n_m
        if shape is not None:
            pattern = self.mask_spec.pattern
            if self.sparsity_schedule == "gmp":
                raise ValueError(
                    f"{option('sparsity_schedule', 'gmp')} ramps an unstructured sparsity; "
                    f"{option('pattern', pattern)} takes acdc or fixed"
                )
            implied = 1 - shape[0] / shape[1]
            if not math.isclose(float(self.sparsity or 0), implied, abs_tol=1e-9):
                raise ValueError(
                    f"{option('pattern', pattern)} prunes 1 - N/M = {implied:g} of the weights,"
                    f" so {option('sparsity')} must be {implied:g}, got {self.sparsity}"
                )
        mask_schedule(self)  # its own checks (GMP needs a run of 2 steps or more)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a dict (e.g. a JSON file), rejecting keys that are not fields (a run's
        ``config.json`` also holds ``notes``, sentences for the reader, which are skipped)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known - {NOTES})
        if unknown:
            close = "".join(did_you_mean(key, known) for key in unknown)
            raise ValueError(
                f"unknown config key(s) {unknown}{close}; the keys are {sorted(known)}"
            )
        return cls(**{key: value for key, value in values.items() if key != NOTES})


def _changed_sparsity_settings(config: TrainConfig) -> list[str]:
    """The sparse-training settings of ``config`` that differ from their defaults, each as the
    user gives it (:func:`~convergent.wording.option`)."""
    changed = []
    default_schedule = TrainConfig.__dataclass_fields__["sparsity_schedule"].default
    if config.sparsity_schedule != default_schedule:
        changed.append(option("sparsity_schedule", config.sparsity_schedule))
    default_spec = MaskSpec()
    for field in dataclasses.fields(MaskSpec):
        value = getattr(config.mask_spec, field.name)
        if value != getattr(default_spec, field.name):
            changed.append(option(field.name, value))
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
        raise ValueError(unknown_choice(name, value, choices))


def default_checkpoint_every(steps: int) -> int:
    """Checkpoint about every tenth of a run of ``steps`` steps (every step in a run of 10 or
    fewer), so that a crash or a kill loses at most a tenth of the work."""
    return max(1, math.ceil(steps / CHECKPOINTS_PER_RUN))


def chosen_defaults(config: TrainConfig, given: Iterable[str]) -> list[str]:
    """Sentences for ``config.json``'s notes: the defaults that depend on the run (the
    learning rate, how often it checkpoints) and were not in ``given`` (the settings the user
    gave)."""
    notes = []
    if "lr" not in given:
        kind = "fine-tuning a pretrained" if config.model in PRETRAINED else "training a"
        notes.append(
            f"lr {config.lr:g}: the default for {kind} {config.model} model (the defaults: "
            + ", ".join(f"{model} {rate:g}" for model, rate in DEFAULT_LEARNING_RATES.items())
            + ")"
        )
    if "checkpoint_every" not in given:
        notes.append(
            f"checkpoint_every {config.checkpoint_every}: a checkpoint about every "
            f"1/{CHECKPOINTS_PER_RUN} of the {config.steps} steps, so a kill loses little"
        )
    return notes


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
            raise ValueError(
                f"{option('model', 'minilm')} needs text data, and {option('data', config.data)}"
                " is not text (e.g. rt-sentences or hf:NAME)"
            )
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
