"""What both sides of ``llmcompressor_compare.py`` share: loading a model, GPT-2's ``Conv1D`` as
``nn.Linear``, the perplexity on the held-apart windows.

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
    """The causal LM of a ``save_pretrained`` folder, float32, in eval mode, with GPT-2's
    ``Conv1D`` layers as ``nn.Linear``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    conv1d_as_linear(model)
    return model.eval()


def load_windows(path: str | Path) -> dict[str, torch.Tensor]:
    """The benchmark's token windows: ``calibration`` (from the train split) and
    ``evaluation`` (held apart), each [windows, tokens] of int64, no padding."""
    return torch.load(str(path), weights_only=True)


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
    """(zeros, entries) over the decoder blocks' linear weights: what both libraries prune."""
    zeros = entries = 0
    for name, module in model.named_modules():
        in_block = ".layers." in f".{name}" or ".h." in f".{name}"  # Llama's, GPT-2's
        if isinstance(module, nn.Linear) and in_block:
            zeros += int((module.weight == 0).sum())
            entries += module.weight.numel()
    return zeros, entries
