"""Perturbations of token embeddings at a level gamma: Gaussian, uniform and discrete.

The scale is relative to the embedding RMS, r = sqrt(mean(W ** 2)) over the whole
word-embedding matrix W (every token, every coordinate), so gamma means the same thing for
every model:

- ``"gaussian"``: e <- e + gamma * r * z, z ~ N(0, I); the noise RMS is gamma * r.
- ``"uniform"``: e <- e + gamma * r * sqrt(3) * v, v ~ U[-1, 1]^d; the same noise RMS as
  the Gaussian at the same gamma (a uniform on [-a, a] has RMS a / sqrt(3)).
- ``"discrete"``: each token's embedding is replaced, with probability gamma, by the
  embedding of a token drawn uniformly from the vocabulary; gamma in [0, 1].

Tokens listed in ``skip_token_ids`` (e.g. [CLS], [SEP], [PAD]) are never perturbed. The
perturbation acts through a forward hook on the word-embedding module, so it works for any
model whose forward takes token ids (our ``Transformer.token_embedding``, BERT's
``embeddings.word_embeddings``), and goes away when the context manager exits.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from convergent.models import unwrap_model

PERTURBATIONS = ("gaussian", "uniform", "discrete")


def embedding_rms(weight: torch.Tensor) -> float:
    """sqrt(mean(W ** 2)) over the embedding matrix: the unit of gamma."""
    return float(weight.detach().float().pow(2).mean().sqrt())


def _check(kind: str, gamma: float) -> None:
    if kind not in PERTURBATIONS:
        raise ValueError(f"perturbation must be one of {', '.join(PERTURBATIONS)}, got {kind!r}")
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma is {gamma}; it must be a finite number >= 0")
    if kind == "discrete" and gamma > 1:
        raise ValueError(f"gamma is {gamma}; a replacement probability must be in [0, 1]")


def perturb_token_embeddings(
    embeddings: torch.Tensor,
    input_ids: torch.Tensor,
    weight: torch.Tensor,
    kind: str,
    gamma: float,
    generator: torch.Generator | None = None,
    skip_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """Perturbed copy of the token embeddings ``embeddings`` (``[..., d]``) of ``input_ids``.

    Args:
        embeddings: the word embeddings of ``input_ids``, ``weight[input_ids]``.
        input_ids: long ``[...]``.
        weight: the embedding matrix ``[vocab, d]`` (sets the scale and the replacements).
        kind: ``"gaussian"``, ``"uniform"`` or ``"discrete"``.
        gamma: the level (see the module docstring).
        generator: a CPU random source, for reproducible perturbations.
        skip_token_ids: token ids left unperturbed.
    """
    _check(kind, gamma)
    if gamma == 0:
        return embeddings
    keep = torch.zeros(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    for token in skip_token_ids:
        keep |= input_ids == token
    change = ~keep
    if kind == "discrete":
        draw = torch.rand(input_ids.shape, generator=generator).to(input_ids.device)
        replace = (draw < gamma) & change
        tokens = torch.randint(0, weight.shape[0], input_ids.shape, generator=generator)
        replacement = weight.detach()[tokens.to(weight.device)].to(embeddings)
        return torch.where(replace.unsqueeze(-1), replacement, embeddings)
    scale = gamma * embedding_rms(weight)
    if kind == "gaussian":
        noise = torch.randn(embeddings.shape, generator=generator)
    else:
        noise = (torch.rand(embeddings.shape, generator=generator) * 2 - 1) * math.sqrt(3.0)
    noise = noise.to(embeddings) * scale * change.unsqueeze(-1).to(embeddings)
    return embeddings + noise


def word_embedding(model: nn.Module) -> nn.Embedding:
    """The token-embedding module of a convergent or Hugging Face model.

    Looks for ``token_embedding`` (our Transformer), then ``get_input_embeddings()`` on the
    model or its ``encoder`` (Hugging Face models, e.g. BERT's ``embeddings.word_embeddings``).
    """
    inner = unwrap_model(model)
    candidates = [getattr(inner, "token_embedding", None)]
    for owner in (inner, getattr(inner, "encoder", None)):
        getter = getattr(owner, "get_input_embeddings", None)
        if callable(getter):
            with contextlib.suppress(NotImplementedError):
                candidates.append(getter())
    for candidate in candidates:
        if isinstance(candidate, nn.Embedding):
            return candidate
    raise ValueError(
        f"{type(inner).__name__} has no token embedding (token_embedding or "
        "get_input_embeddings()); perturbations need a model that takes token ids"
    )


@contextlib.contextmanager
def perturbed_embeddings(
    model: nn.Module,
    kind: str,
    gamma: float,
    *,
    seed: int | None = 0,
    skip_token_ids: Sequence[int] = (),
    embedding: nn.Embedding | None = None,
) -> Iterator[nn.Embedding]:
    """Perturb every token embedding ``model`` computes inside the ``with`` block.

    Example:
        >>> with perturbed_embeddings(model, "gaussian", gamma=0.5, skip_token_ids=[101, 102, 0]):
        ...     metrics = evaluate(model, test_data, task)

    Args:
        model: a model with a token embedding (see :func:`word_embedding`).
        kind: ``"gaussian"``, ``"uniform"`` or ``"discrete"``.
        gamma: the level, relative to the embedding RMS (or a probability for discrete).
        seed: seeds a generator used for every forward inside the block (None: global RNG).
        skip_token_ids: token ids never perturbed (special tokens, padding).
        embedding: the module to hook, if :func:`word_embedding` cannot find it.

    Yields:
        The hooked embedding module.
    """
    _check(kind, gamma)
    module = embedding if embedding is not None else word_embedding(model)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    skip = tuple(int(token) for token in skip_token_ids)

    def hook(_: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        return perturb_token_embeddings(
            output, args[0], module.weight, kind, gamma, generator, skip
        )

    handle = module.register_forward_hook(hook)
    try:
        yield module
    finally:
        handle.remove()
