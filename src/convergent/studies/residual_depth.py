"""Part (b) of the ``residual`` study: residuals at depth, on rt-sentences with MiniLM layers.

A depth-L encoder is MiniLM-L6 with its layer list cut or extended: depth <= 6 keeps the
first L pretrained layers; depth > 6 keeps all six and appends L - 6 freshly initialized
BERT layers (BERT's initializer, N(0, 0.02)) on top. The residual coefficient beta is applied
inside both sublayers of every layer by `ScaledResidualOutput`, which replaces BERT's
``LayerNorm(dropout(dense(h)) + x)`` with ``LayerNorm(dropout(dense(h)) + beta * x)``; beta = 1
is MiniLM unchanged, beta = 0 removes every residual connection. The parameter names stay
those of BERT (``dense``, ``LayerNorm``), so checkpoints and LoRA targets are unaffected.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..models import HFEncoder


class ScaledResidualOutput(nn.Module):
    """BERT's sublayer output with a residual coefficient: LN(dropout(dense(h)) + beta * x).

    Args:
        original: a ``BertSelfOutput`` or ``BertOutput`` (anything with ``dense``, ``dropout``
            and ``LayerNorm``); its modules are reused, not copied.
        beta: the residual coefficient in [0, 1].
    """

    def __init__(self, original: Any, beta: float) -> None:
        super().__init__()
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta={beta} is out of range; allowed range is [0, 1].")
        self.dense = original.dense
        self.dropout = original.dropout
        self.LayerNorm = original.LayerNorm  # BERT's name, kept so state dicts still match
        self.beta = float(beta)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        """The sublayer output for branch input ``hidden_states`` and residual ``input_tensor``."""
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + self.beta * input_tensor)


def set_residual_coefficient(encoder: Any, beta: float) -> int:
    """Wrap every BERT sublayer output of ``encoder`` in `ScaledResidualOutput`; returns how
    many were wrapped (two per layer)."""
    wrapped = 0
    for layer in encoder.encoder.layer:
        for owner, attribute in ((layer.attention, "output"), (layer, "output")):
            current = getattr(owner, attribute)
            if isinstance(current, ScaledResidualOutput):
                current.beta = float(beta)
            else:
                setattr(owner, attribute, ScaledResidualOutput(current, beta))
            wrapped += 1
    return wrapped


def _reinitialize(layer: Any, std: float) -> None:
    """BERT's initializer: linear weights N(0, std) and zero biases, LayerNorm 1 and 0."""
    with torch.no_grad():
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()


def load_minilm(path: Any) -> Any:
    """The pretrained MiniLM-L6 encoder (a ``BertModel``, sdpa attention, no pooler)."""
    return HFEncoder.from_pretrained(path, attn_implementation="sdpa").encoder


def minilm_at_depth(
    pretrained_encoder: nn.Module, depth: int, beta: float, seed: int, pooling: str = "mean"
) -> tuple[HFEncoder, str]:
    """A copy of a pretrained BERT-family encoder cut or extended to ``depth`` layers, with
    residual coefficient ``beta`` and a new classification head (seeded with ``seed``).

    Returns:
        ``(model, description)``; the description says which layers are pretrained.
    """
    if depth < 1:
        raise ValueError(f"depth={depth} is out of range; it must be >= 1.")
    torch.manual_seed(seed)
    encoder: Any = copy.deepcopy(pretrained_encoder)
    layers = encoder.encoder.layer
    pretrained = len(layers)
    if depth <= pretrained:
        encoder.encoder.layer = nn.ModuleList(list(layers)[:depth])
        description = f"pretrained layers 0-{depth - 1}"
    else:
        extra = []
        for _ in range(depth - pretrained):
            fresh = copy.deepcopy(layers[-1])
            _reinitialize(fresh, float(getattr(encoder.config, "initializer_range", 0.02)))
            extra.append(fresh)
        encoder.encoder.layer = nn.ModuleList([*layers, *extra])
        description = (
            f"pretrained layers 0-{pretrained - 1} + {depth - pretrained} randomly "
            f"initialized layers on top"
        )
    encoder.config.num_hidden_layers = depth
    set_residual_coefficient(encoder, beta)
    model = HFEncoder(encoder, task="classification", num_outputs=2, pooling=pooling)
    model.train()
    return model, description


@dataclass
class DepthRun:
    """One training run at one (depth, beta, seed).

    Attributes:
        depth, beta, seed: the setting.
        initialization: which layers were pretrained.
        losses: the training loss of every step.
        validation_error: 1 - accuracy on the validation subset at the end.
        validation_loss: the mean loss there.
        seconds: wall time.
    """

    depth: int
    beta: float
    seed: int
    initialization: str = ""
    losses: list[float] = field(default_factory=list)
    validation_error: float = float("nan")
    validation_loss: float = float("nan")
    seconds: float = 0.0


def rt_sentence_data(
    max_length: int, train_examples: int, validation_examples: int, seed: int = 0
) -> tuple[Any, Any]:
    """Train and validation subsets of rt-sentences (first examples of the seeded split)."""
    from ..data import load_splits

    splits = load_splits("rt-sentences", seed=seed, max_length=max_length)
    train, validation = splits.train, splits.validation
    train_count = min(train_examples, len(train))
    validation_count = min(validation_examples, len(validation))
    return (
        train.subset(torch.arange(train_count)),
        validation.subset(torch.arange(validation_count)),
    )


def train_one_depth(
    pretrained: nn.Module,
    train: Any,
    validation: Any,
    depth: int,
    beta: float,
    seed: int,
    *,
    steps: int,
    batch_size: int,
    lr: float,
) -> DepthRun:
    """One (depth, beta, seed) run: AdamW (constant ``lr``, no weight decay, word embeddings
    frozen) for ``steps`` steps, batches drawn in the order of ``seed``.

    The model and its head are seeded inside (``minilm_at_depth``), so the run is the same
    whether it is computed alone or in a sweep (the study's unit cache relies on that).
    """
    from ..train import evaluate, fit

    started = time.perf_counter()
    model, description = minilm_at_depth(pretrained, depth, beta, seed)
    # Frozen in every setting: AdamW over the 30522 x 384 table would dominate.
    encoder: Any = model.encoder
    encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    result = fit(
        model,
        optimizer,
        train,
        max_steps=steps,
        batch_size=batch_size,
        task="classification",
        seed=seed,
        progress=False,
        tensorboard=False,
    )
    losses = [float(r["loss"]) for r in result.history if r.get("split") == "train"]
    scores = evaluate(model, validation, "classification", batch_size=128)
    return DepthRun(
        depth=depth,
        beta=beta,
        seed=seed,
        initialization=description,
        losses=losses,
        validation_error=1.0 - float(scores["accuracy"]),
        validation_loss=float(scores["loss"]),
        seconds=time.perf_counter() - started,
    )


def depth_run_to_dict(run: DepthRun) -> dict[str, Any]:
    """The run's fields as plain lists and numbers (what ``torch.load(weights_only=True)``
    reads back); ``DepthRun(**depth_run_to_dict(run))`` rebuilds it."""
    return {
        "depth": int(run.depth),
        "beta": float(run.beta),
        "seed": int(run.seed),
        "initialization": str(run.initialization),
        "losses": [float(v) for v in run.losses],
        "validation_error": float(run.validation_error),
        "validation_loss": float(run.validation_loss),
        "seconds": float(run.seconds),
    }
