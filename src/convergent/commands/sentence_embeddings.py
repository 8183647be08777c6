"""Sentence encoders without a head (``BertModel``, a sentence-transformers folder such as
all-MiniLM-L6-v2): what ``prune`` scores them by.

There is no loss to score, but there is a natural measure of what pruning cost: how close the
pruned model's sentence embeddings stay to the dense model's. On held-apart sentences, each
model's last hidden states are pooled as the folder's sentence-transformers config says
(``modules.json`` names a ``Pooling`` module whose ``config.json`` picks mean, CLS or max
pooling; mean when there is none), normalised to unit length, and the score is

    embedding_cosine = mean over sentences of <e_pruned, e_dense>

(1 for the dense model itself). sentence-transformers' own files are copied beside the pruned
weights, so the written folder loads in sentence-transformers as the original did.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from convergent.io import make_readable

SENTENCE_EMBEDDING = "sentence-embedding"
EMBEDDING_METRIC = "embedding_cosine"
POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
# sentence-transformers' files beside the weights (the module folders are found in modules.json)
SENTENCE_TRANSFORMERS_FILES = (
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
)


def _modules(folder: Path) -> list[dict[str, Any]]:
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    return [module for module in modules if isinstance(module, dict)]


def pooling_mode(folder: str | Path) -> str:
    """``"mean"``, ``"cls"`` or ``"max"``: the folder's sentence-transformers pooling (mean when
    it has no such config)."""
    for module in _modules(Path(folder)):
        if str(module.get("type", "")).endswith("Pooling"):
            try:
                config = json.loads((Path(folder) / module["path"] / "config.json").read_text())
            except (OSError, ValueError, KeyError):
                break
            for key, mode in POOLING_MODES.items():
                if config.get(key):
                    return mode
    return "mean"


def pool(hidden: Tensor, attention_mask: Tensor, mode: str) -> Tensor:
    """``[B, T, d]`` hidden states -> ``[B, d]`` by ``mode`` over the real tokens, normalised."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        pooled = hidden[:, 0]
    elif mode == "max":
        pooled = hidden.masked_fill(mask == 0, float("-inf")).amax(dim=1)
    else:
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return F.normalize(pooled.double(), dim=-1)


@torch.no_grad()
def sentence_embeddings(model: nn.Module, dataset: Any, mode: str, batch_size: int) -> Tensor:
    """The pooled, normalised embeddings of every example of ``dataset`` (float64 ``[N, d]``)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    tensors = dataset.tensors
    rows = []
    try:
        for start in range(0, len(dataset), batch_size):
            ids = tensors["input_ids"][start : start + batch_size].to(device)
            mask = tensors["attention_mask"][start : start + batch_size].to(device)
            hidden = model(input_ids=ids, attention_mask=mask)[0]
            rows.append(pool(hidden, mask, mode).cpu())
    finally:
        model.train(was_training)
    return torch.cat(rows)


def embedding_fidelity(
    dataset: Any, mode: str, batch_size: int
) -> Callable[[nn.Module], dict[str, float]]:
    """A measure for ``prune``'s sweep: its first call (the dense model) records the reference
    embeddings; every call returns ``{"embedding_cosine": mean cosine to them}``."""
    reference: list[Tensor] = []

    def measure(model: nn.Module) -> dict[str, float]:
        embeddings = sentence_embeddings(model, dataset, mode, batch_size)
        if not reference:
            reference.append(embeddings)
        return {EMBEDDING_METRIC: float((embeddings * reference[0]).sum(dim=-1).mean())}

    return measure


def copy_sentence_transformers_files(source: str | Path, target: str | Path) -> list[str]:
    """Copy sentence-transformers' configuration (``modules.json``, its module folders other
    than the transformer's own, and their configs) from ``source`` to ``target``; returns the
    names copied."""
    source, target = Path(source), Path(target)
    copied = []
    for name in SENTENCE_TRANSFORMERS_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
            copied.append(name)
    for module in _modules(source):
        path = str(module.get("path", ""))
        if path and (source / path).is_dir() and not (target / path).exists():
            shutil.copytree(source / path, target / path)
            copied.append(path)
    for name in copied:  # readable as every file the command writes
        for file in [target / name, *(target / name).rglob("*")]:
            if file.is_file():
                make_readable(file)
    return copied
