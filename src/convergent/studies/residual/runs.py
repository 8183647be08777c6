"""What one unit of the ``residual`` study computes: a training run and its measurements.

Part (a): full-batch gradient descent on the one-layer Transformer, squared loss, the whole
training subset in every step, plain SGD without momentum. For each beta we record the loss
curve and, every few steps, the singular values of the attention output A = Attn(X) and of the
residual branch beta * X + A, over the training subset. Part (b): AdamW on MiniLM at a depth,
recording the training loss of every step and the validation error at the end.
Functions here take plain arguments (`train_one_layer` computes one part (a) unit); the study's
config stops in ``study.py``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from convergent.data import load_splits, minilm_path
from convergent.diagnostics import attention_spectra
from convergent.losses import task_loss
from convergent.models import Transformer
from convergent.studies.residual.models import load_minilm, minilm_at_depth, one_layer_model
from convergent.train import evaluate, fit


@dataclass
class GradientDescentRun:
    """One full-batch GD run at one (beta, init seed, step size): the training loss before each
    step and after the last (``steps`` + 1 values, fewer where the loss became non-finite and
    the run ``diverged``), and at each of ``spectra_steps`` the mean over examples of the
    extreme singular values of Attn(X), of beta * X + Attn(X) (``residual_``) and of their
    ``(sigma_min / sigma_max)^2``."""

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
    splits = load_splits("weather-hourly", window=window)
    inputs, labels = splits.train.tensors["inputs"], splits.train.tensors["labels"]
    if not 1 <= examples <= len(inputs):
        raise ValueError(
            f"examples={examples} is out of range; allowed range is [1, {len(inputs)}]."
        )
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(inputs), generator=generator)[:examples]
    return inputs[chosen], labels[chosen], int(splits.num_outputs)


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
        optimizer.zero_grad(set_to_none=True)
        loss = task_loss(model(inputs=inputs).logits, labels, "regression")
        value = float(loss.detach())
        # A diverged model's spectra cannot be computed (the SVD refuses NaN): the run ends
        # below without them.
        if (step % spectra_every == 0 or step == steps) and math.isfinite(value):
            _measure(model, inputs, run, step)
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


CASTS: dict[str, Any] = {"float": float, "int": int, "bool": bool, "str": str}


def plain(run: Any) -> dict[str, Any]:
    """A run's fields as plain numbers and lists (what ``torch.load(weights_only=True)`` reads
    back); ``type(run)(**plain(run))`` rebuilds it."""
    values = {}
    for item in fields(run):
        kind, value = str(item.type), getattr(run, item.name)
        inner = kind.removeprefix("list[").removesuffix("]")
        values[item.name] = (
            [CASTS[inner](v) for v in value] if inner != kind else CASTS[kind](value)
        )
    return values


@contextlib.contextmanager
def limited_threads(count: int) -> Iterator[None]:
    """Run tiny-matrix work on at most ``count`` threads and restore the setting afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(min(count, previous))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@functools.cache
def _weather(window: int, examples: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The part (a) training windows (data seed 0), loaded once per process."""
    return weather_subset(window, examples, 0)


def train_one_layer(
    lr: float, steps: int, beta: float, seed: int, data: tuple[int, int], keywords: dict[str, Any]
) -> dict[str, Any]:
    """A part (a) unit: the run on the (window, examples) ``data`` with `train_one_beta`'s
    other ``keywords``, as a dict, on one thread: the one-layer model's matrices are
    tiny, and threads would only add overhead (a top-level function, so a process pool can
    call it)."""
    with limited_threads(1):
        inputs, labels, _ = _weather(*data)
        run = train_one_beta(
            inputs, labels, beta, seed, steps=steps, lr=lr, window=data[0], **keywords
        )
    return plain(run)


@dataclass
class DepthRun:
    """One training run at one (depth, beta, seed): which layers were pretrained, the training
    loss of every step, and 1 - accuracy and the mean loss on the validation subset at the end."""

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


# Part (b)'s model and rt-sentences subsets, loaded once per process, when a unit is computed.
minilm = functools.cache(lambda: load_minilm(minilm_path()))
sentences = functools.cache(rt_sentence_data)


def train_depth_unit(
    depth: int, beta: float, seed: int, data: tuple[int, int, int], training: dict[str, Any]
) -> dict[str, Any]:
    """A part (b) unit: the run on rt-sentences' (max_length, train_examples,
    validation_examples) ``data`` with `train_one_depth`'s keywords ``training``, as a dict."""
    train, validation = sentences(*data)
    return plain(train_one_depth(minilm(), train, validation, depth, beta, seed, **training))
