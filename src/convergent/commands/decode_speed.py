"""Generation speed, dense against sparse kernels: tokens per second of ``model.generate``
(greedy, KV cache on, batch 1) and the bytes of weight each generated token reads.

    sparse = copy.deepcopy(model); to_sparse_kernels(sparse, tokens=1)
    result = time_generation(model, sparse, new_tokens=64)
    print(result["speedup"], result["memory_limit"], result["share_of_limit"])

A decoding step reads every weight matrix once, so its speed is bound by those bytes: the
limit of a sparse model's speed-up is (bytes read per token dense) / (bytes read per token
sparse), counted here layer by layer from the modules as they stand (a dense layer's weight,
a decode kernel's values, columns and row starts, a CSR layer's values and indices). The
embedding table is not counted (a token reads one row of it). Each printed speed-up sits
beside its share of that limit.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn

from convergent.sparse.decode_kernels import IndexedLinear
from convergent.sparse.kernels import SparseLinear
from convergent.sparse.selection import is_conv1d

PROMPT_TOKENS = 32
NEW_TOKENS = 64
REPEATS = 3


def _tensor_bytes(tensor: Tensor) -> int:
    if tensor.layout == torch.sparse_csr or tensor.layout == torch.sparse_bsr:
        parts = [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    else:
        parts = [tensor]
    return sum(part.numel() * part.element_size() for part in parts)


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weight one decoding step reads: every linear layer (``nn.Linear``, ``Conv1D``,
    and the sparse modules that replaced them), with its bias."""
    total = 0
    for module in model.modules():
        if isinstance(module, IndexedLinear):
            total += module.stored_bytes
        elif isinstance(module, SparseLinear):
            total += _tensor_bytes(module.sparse_weight)
        elif isinstance(module, nn.Linear) or is_conv1d(module):
            total += _tensor_bytes(module.get_parameter("weight"))
        else:
            continue
        bias = getattr(module, "bias", None)
        total += _tensor_bytes(bias) if isinstance(bias, Tensor) else 0
    return total


def prompt_ids(model: nn.Module, tokens: int = PROMPT_TOKENS, seed: int = 0) -> Tensor:
    """A fixed ``[1, tokens]`` prompt of random token ids."""
    config: Any = model.config
    vocabulary = int(config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocabulary, (1, tokens), generator=generator)


@torch.no_grad()
def generate_tokens(model: nn.Module, prompt: Tensor, new_tokens: int) -> Tensor:
    """Greedy generation with the KV cache: exactly ``new_tokens`` new ids, ``[1, new]``."""
    output = model.generate(  # type: ignore[operator]
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
    )
    return output[:, prompt.shape[1] :]


def time_generation(
    dense: nn.Module,
    sparse: nn.Module,
    *,
    prompt_tokens: int = PROMPT_TOKENS,
    new_tokens: int = NEW_TOKENS,
    repeats: int = REPEATS,
) -> dict[str, Any]:
    """Tokens per second of ``generate`` for the dense and the sparse model, in turn
    (dense, sparse, dense, ...: the machine's load falls on both alike), the fastest of
    ``repeats`` samples each (other processes only ever add time).

    Returns:
        ``{"dense_tokens_per_second", "sparse_tokens_per_second", "speedup",
        "dense_bytes_per_token", "sparse_bytes_per_token", "memory_limit",
        "share_of_limit", "same_tokens", "new_tokens", "prompt_tokens"}``; ``same_tokens``:
        whether the sparse model generated the dense model's ids.
    """
    if new_tokens < 1 or prompt_tokens < 1 or repeats < 1:
        raise ValueError(
            f"new_tokens={new_tokens}, prompt_tokens={prompt_tokens} and repeats={repeats} "
            "must each be >= 1"
        )
    prompt = prompt_ids(dense, prompt_tokens)
    outputs: dict[str, Tensor] = {}
    seconds: dict[str, list[float]] = {"dense": [], "sparse": []}
    for _ in range(repeats):
        for name, model in (("dense", dense), ("sparse", sparse)):
            start = time.perf_counter()
            outputs[name] = generate_tokens(model, prompt, new_tokens)
            seconds[name].append(time.perf_counter() - start)
    dense_rate = new_tokens / min(seconds["dense"])
    sparse_rate = new_tokens / min(seconds["sparse"])
    dense_bytes, sparse_bytes = weight_bytes_per_token(dense), weight_bytes_per_token(sparse)
    limit = dense_bytes / max(sparse_bytes, 1)
    speedup = sparse_rate / dense_rate
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "dense_tokens_per_second": dense_rate,
        "sparse_tokens_per_second": sparse_rate,
        "speedup": speedup,
        "dense_bytes_per_token": dense_bytes,
        "sparse_bytes_per_token": sparse_bytes,
        "memory_limit": limit,
        "share_of_limit": speedup / limit,
        "same_tokens": bool(torch.equal(outputs["dense"], outputs["sparse"])),
    }


def bench_generation(model: nn.Module, new_tokens: int, repeats: int = REPEATS) -> dict[str, Any]:
    """``convergent bench --generate N``: :func:`time_generation` of ``model`` against a copy
    on sparse kernels chosen at one token, with the layers that switched.

    Raises:
        ValueError: a model that cannot generate, or ``new_tokens`` out of range.
    """
    import copy

    from convergent.sparse.kernels import to_sparse_kernels

    can_generate = getattr(model, "can_generate", None)
    if not callable(can_generate) or not can_generate():
        raise ValueError(
            f"--generate needs a model that generates text (a causal LM); "
            f"{type(model).__name__} does not"
        )
    config: Any = model.config
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    if new_tokens < 1 or (positions is not None and new_tokens >= positions):
        allowed = f"in [1, {positions - 1}]" if positions else ">= 1"
        raise ValueError(f"--generate {new_tokens} is out of range; it must be {allowed}")
    prompt = min(PROMPT_TOKENS, positions - new_tokens) if positions else PROMPT_TOKENS
    sparse = copy.deepcopy(model)
    report = to_sparse_kernels(sparse, tokens=1)
    result = time_generation(
        model, sparse, prompt_tokens=prompt, new_tokens=new_tokens, repeats=repeats
    )
    causes: dict[str, int] = {}
    for layer in report.layers:
        if layer.kernel == "dense":
            causes[layer.cause] = causes.get(layer.cause, 0) + 1
    result.update(
        sparse_layers=len(report.converted), pruned_layers=len(report.layers), dense_causes=causes
    )
    return result


def generation_line(row: dict[str, Any]) -> str:
    """``bench``'s sentence on ``generate``: speeds, bytes per token and the share of the
    limit where some layer switched; else why none did, and no ratio."""
    from convergent.sparse.kernels import CAUSES

    what = (
        f"generate ({row['prompt_tokens']}-token prompt, {row['new_tokens']} new tokens, "
        "greedy, KV cache, batch 1)"
    )
    if row["sparse_layers"] == 0:
        causes = row.get("dense_causes") or {}
        why = "; ".join(f"{count} {CAUSES.get(cause, cause)}" for cause, count in causes.items())
        return (
            f"{what}: dense {row['dense_tokens_per_second']:.1f} tokens/s; no layer switched at "
            f"one token, so no speed-up is printed ({why or 'no linear layer has zeros'})."
        )
    mib = 2**20
    return (
        f"{what}: dense {row['dense_tokens_per_second']:.1f} tokens/s, sparse kernels "
        f"{row['sparse_tokens_per_second']:.1f} ({row['speedup']:.2f}x; {row['sparse_layers']} "
        f"of {row['pruned_layers']} pruned layers switched); weights read per token "
        f"{row['dense_bytes_per_token'] / mib:.1f} MiB dense, "
        f"{row['sparse_bytes_per_token'] / mib:.1f} MiB sparse, a limit of "
        f"{row['memory_limit']:.2f}x, {row['share_of_limit']:.0%} of it reached; "
        f"{'the same' if row['same_tokens'] else 'not the same'} tokens as dense."
    )
