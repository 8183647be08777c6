"""What both sides of ``llmcompressor_compare.py`` share: loading a model, GPT-2's ``Conv1D`` as
``nn.Linear``, the perplexity on the held-apart windows, and for a sentence encoder (MiniLM) the
mean cosine of its pooled embeddings to the dense model's.

This module imports only torch and transformers, so that llm-compressor's own virtual
environment (which has no ``convergent``) runs it unchanged: both libraries' models are
loaded, converted and scored by the same lines.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

EVALUATION_BATCH = 32


def conv1d_as_linear(model: nn.Module) -> int:
    """Replace every transformers ``Conv1D`` (GPT-2's, weight stored [in, out]) by the
    equivalent ``nn.Linear`` (weight [out, in]), in place; returns how many.

    llm-compressor 0.14's prunable types name torch's ``Conv1d``, not transformers'
    ``Conv1D``, so it would prune no GPT-2 matrix; both libraries prune the converted model.
    """
    replaced = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__ != "Conv1D":
                continue
            inputs, outputs = child.weight.shape
            linear = nn.Linear(inputs, outputs, bias=child.bias is not None)
            with torch.no_grad():
                linear.weight.copy_(child.weight.T)
                if child.bias is not None:
                    linear.bias.copy_(child.bias)
            setattr(parent, child_name, linear)
            replaced += 1
    return replaced


def load_model(folder: str | Path) -> nn.Module:
    """The model of a ``save_pretrained`` folder, float32, in eval mode: its causal LM, with
    GPT-2's ``Conv1D`` layers as ``nn.Linear``; or, for an encoder without a head (such as
    all-MiniLM-L6-v2's ``BertModel``), the bare model."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    architectures = AutoConfig.from_pretrained(str(folder)).architectures or []
    causal = any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in architectures)
    loader = AutoModelForCausalLM if causal else AutoModel
    model = loader.from_pretrained(str(folder), dtype=torch.float32)
    conv1d_as_linear(model)
    return model.eval()


def load_windows(path: str | Path) -> dict[str, torch.Tensor]:
    """The benchmark's token windows: ``calibration`` (from the train split) and
    ``evaluation`` (held apart), each [windows, tokens] of int64, no padding; for a sentence
    encoder, sentences padded to one length, with ``calibration_mask`` and ``evaluation_mask``
    (their attention masks) and ``pooling`` (the folder's sentence-transformers pooling)."""
    return torch.load(str(path), weights_only=True)


def calibration_batches(windows: dict, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """The calibration windows as batches of model inputs, in order (with their attention
    masks where they have them)."""
    ids = windows["calibration"]
    mask = windows.get("calibration_mask")
    batches = []
    for start in range(0, len(ids), batch_size):
        batch = {"input_ids": ids[start : start + batch_size]}
        if mask is not None:
            batch["attention_mask"] = mask[start : start + batch_size]
        batches.append(batch)
    return batches


@torch.no_grad()
def sentence_embeddings(model: nn.Module, windows: dict) -> torch.Tensor:
    """The evaluation sentences' embeddings ([sentences, d], float64, unit length): the last
    hidden states pooled over the real tokens as ``windows["pooling"]`` says (mean, cls or
    max), as ``convergent prune`` scores a sentence encoder (its ``sentence_embeddings.pool``)."""
    ids, masks, mode = windows["evaluation"], windows["evaluation_mask"], windows["pooling"]
    rows = []
    for start in range(0, len(ids), EVALUATION_BATCH):
        mask = masks[start : start + EVALUATION_BATCH]
        hidden = model(input_ids=ids[start : start + EVALUATION_BATCH], attention_mask=mask)[0]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        if mode == "cls":
            pooled = hidden[:, 0]
        elif mode == "max":
            pooled = hidden.masked_fill(weights == 0, float("-inf")).amax(dim=1)
        else:
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        rows.append(torch.nn.functional.normalize(pooled.double(), dim=-1))
    return torch.cat(rows)


def dense_reference(model: nn.Module, windows: dict) -> torch.Tensor | None:
    """For a sentence encoder, its (dense) embeddings of the evaluation sentences, taken before
    pruning in the same process; None for a causal LM."""
    return sentence_embeddings(model, windows) if "pooling" in windows else None


def quality(model: nn.Module, windows: dict, reference: torch.Tensor | None) -> dict[str, float]:
    """``{"perplexity": ...}`` of a causal LM on the evaluation windows, or ``{"cosine": ...}``:
    a sentence encoder's mean cosine to its dense embeddings ``reference``."""
    if reference is None:
        return {"perplexity": perplexity(model, windows["evaluation"])}
    embeddings = sentence_embeddings(model, windows)
    return {"cosine": float((embeddings * reference).sum(dim=-1).mean())}


@torch.no_grad()
def perplexity(model: nn.Module, windows: torch.Tensor) -> float:
    """exp(mean next-token cross-entropy) over every predicted token of ``windows``."""
    total, count = 0.0, 0
    for start in range(0, len(windows), EVALUATION_BATCH):
        batch = windows[start : start + EVALUATION_BATCH]
        logits = model(input_ids=batch).logits[:, :-1].float()
        targets = batch[:, 1:]
        total += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
        ).item()
        count += targets.numel()
    return math.exp(total / count)


def prunable_zeros(model: nn.Module) -> tuple[int, int]:
    """(zeros, entries) over the blocks' linear weights: what both libraries prune."""
    zeros = entries = 0
    for name, module in model.named_modules():
        dotted = f".{name}"
        in_block = (
            ".layers." in dotted or ".h." in dotted or ".layer." in dotted
        )  # Llama, GPT-2, BERT
        if isinstance(module, nn.Linear) and in_block:
            zeros += int((module.weight == 0).sum())
            entries += module.weight.numel()
    return zeros, entries
