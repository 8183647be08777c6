"""Part (a) of the ``residual`` study: full-batch gradient descent on a one-layer Transformer.

One block (single-head softmax attention + FFN, residual coefficient beta, no LayerNorm),
squared loss, the whole training subset in every step, plain SGD without momentum. For each
beta we record the loss curve and, every few steps, the singular values of the attention
output A = Attn(X) and of the residual branch beta * X + A, over the training subset.
Functions here take plain arguments; the study's config stops in ``residual.py``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..diagnostics import attention_spectra
from ..losses import task_loss
from ..models import Transformer, TransformerConfig

# The spectra a run records at every measurement, in the order of GradientDescentRun's fields.
SPECTRA_FIELDS = (
    "sigma_min",
    "sigma_max",
    "residual_sigma_min",
    "residual_sigma_max",
    "squared_ratio",
    "residual_squared_ratio",
)


@dataclass
class GradientDescentRun:
    """One full-batch GD run at one beta and one seed.

    Attributes:
        beta: the residual coefficient.
        seed: the initialization seed.
        lr: the GD step size.
        steps: the number of GD steps asked for.
        losses: the training loss before each step and after the last (steps + 1 values).
        spectra_steps: the steps at which spectra were measured.
        sigma_min, sigma_max: mean over examples of the extreme singular values of Attn(X).
        residual_sigma_min, residual_sigma_max: the same for beta * X + Attn(X).
        squared_ratio: mean over examples of (sigma_min / sigma_max)^2 of Attn(X).
        residual_squared_ratio: the same for beta * X + Attn(X).
        diverged: the loss became non-finite (the curve stops there).
        seconds: wall time.
    """

    beta: float
    seed: int
    lr: float = math.nan
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    spectra_steps: list[int] = field(default_factory=list)
    sigma_min: list[float] = field(default_factory=list)
    sigma_max: list[float] = field(default_factory=list)
    residual_sigma_min: list[float] = field(default_factory=list)
    residual_sigma_max: list[float] = field(default_factory=list)
    squared_ratio: list[float] = field(default_factory=list)
    residual_squared_ratio: list[float] = field(default_factory=list)
    diverged: bool = False
    seconds: float = 0.0


def weather_subset(
    window: int, examples: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``examples`` training windows of weather-hourly drawn at random with ``seed``.

    Returns:
        ``(inputs [N, window, C], labels [N, C], C)``, standardized as ``load_splits`` does.
    """
    from ..data import load_splits

    splits = load_splits("weather-hourly", window=window)
    inputs, labels = splits.train.tensors["inputs"], splits.train.tensors["labels"]
    if not 1 <= examples <= len(inputs):
        raise ValueError(
            f"examples={examples} is out of range; allowed range is [1, {len(inputs)}]."
        )
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(inputs), generator=generator)[:examples]
    return inputs[chosen], labels[chosen], int(splits.num_outputs)


def one_layer_model(
    input_dim: int,
    num_outputs: int,
    window: int,
    d_model: int,
    d_ff: int,
    beta: float,
    init_std: float,
    seed: int,
) -> Transformer:
    """The paper's model: one block, one head, no norm, readout from the last token."""
    torch.manual_seed(seed)
    return Transformer(
        TransformerConfig(
            task="regression",
            num_outputs=num_outputs,
            input_dim=input_dim,
            max_len=window,
            d_model=d_model,
            n_heads=1,
            n_layers=1,
            d_ff=d_ff,
            beta=beta,
            norm="none",
            pooling="last",
            dropout=0.0,
            init_std=init_std,
        )
    )


def _measure(model: Transformer, inputs: torch.Tensor, run: GradientDescentRun, step: int) -> None:
    spectra = attention_spectra(model, {"inputs": inputs})
    low, high = spectra.sigma_min[0].double(), spectra.sigma_max[0].double()
    residual_low = spectra.residual_sigma_min[0].double()
    residual_high = spectra.residual_sigma_max[0].double()
    run.spectra_steps.append(step)
    run.sigma_min.append(float(low.mean()))
    run.sigma_max.append(float(high.mean()))
    run.residual_sigma_min.append(float(residual_low.mean()))
    run.residual_sigma_max.append(float(residual_high.mean()))
    run.squared_ratio.append(float((low / high).square().mean()))
    run.residual_squared_ratio.append(float((residual_low / residual_high).square().mean()))


def train_full_batch(
    model: Transformer,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    steps: int,
    lr: float,
    spectra_every: int,
    run: GradientDescentRun,
) -> GradientDescentRun:
    """Full-batch GD: theta <- theta - lr * grad L(theta), L the mean squared error over all
    examples. Fills ``run`` in place and returns it."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    started = time.perf_counter()
    model.train()  # no dropout in this model; train mode only for clarity
    for step in range(steps + 1):
        if step % spectra_every == 0 or step == steps:
            _measure(model, inputs, run, step)
        optimizer.zero_grad(set_to_none=True)
        loss = task_loss(model(inputs=inputs).logits, labels, "regression")
        value = float(loss.detach())
        run.losses.append(value)
        if not math.isfinite(value):
            run.diverged = True
            break
        if step == steps:
            break
        loss.backward()
        optimizer.step()
    run.seconds = time.perf_counter() - started
    return run


def train_one_beta(
    inputs: torch.Tensor,
    labels: torch.Tensor,
    beta: float,
    seed: int,
    *,
    window: int,
    d_model: int,
    d_ff: int,
    init_std: float,
    steps: int,
    lr: float,
    spectra_every: int,
) -> GradientDescentRun:
    """One (beta, seed) run: a fresh model seeded with ``seed``, full-batch GD on the data.

    Everything random is drawn after ``torch.manual_seed(seed)``, so the run is the same
    whether it is computed alone or in a sweep (the study's unit cache relies on that).
    """
    channels = int(inputs.shape[-1])
    outputs = int(labels.shape[-1])
    model = one_layer_model(channels, outputs, window, d_model, d_ff, beta, init_std, seed)
    return train_full_batch(
        model, inputs, labels, steps, lr, spectra_every, GradientDescentRun(beta, seed, lr, steps)
    )


def run_to_dict(run: GradientDescentRun) -> dict[str, Any]:
    """The run's fields as plain lists and numbers (what ``torch.load(weights_only=True)``
    reads back); ``GradientDescentRun(**run_to_dict(run))`` rebuilds it."""
    return {
        "beta": float(run.beta),
        "seed": int(run.seed),
        "lr": float(run.lr),
        "steps": int(run.steps),
        "losses": [float(v) for v in run.losses],
        "spectra_steps": [int(v) for v in run.spectra_steps],
        **{key: [float(v) for v in getattr(run, key)] for key in SPECTRA_FIELDS},
        "diverged": bool(run.diverged),
        "seconds": float(run.seconds),
    }
