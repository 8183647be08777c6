"""Compressed model folders: ``save_sparse`` writes one, ``load_sparse`` reads it back bit for bit.

    save_sparse(model, "runs/gpt2-pruned", tokenizer=tokenizer)   # a Hugging Face model
    save_sparse(model, "runs/lm-pruned", run_config=config)       # one of our run's models
    model = load_sparse("runs/gpt2-pruned")

Two kinds of folder, and ``convergent prune``, ``diagnose`` and ``bench`` read both:

- a Hugging Face folder: ``config.json`` (and ``generation_config.json``), the tokenizer when
  given, and the weights in ``sparse_model.safetensors`` (:mod:`convergent.sparse.storage`)
  instead of ``model.safetensors``; ``config.json``'s ``quantization_config`` names the
  format, so ``from_pretrained`` reads the folder too once ``convergent`` is imported
  (:mod:`convergent.sparse.transformers_quantizer`).
- a run folder: the run's ``config.json`` and ``checkpoints/step-N/`` holding
  ``sparse_model.safetensors``, ``state.pt`` and the sha256 manifest.

Everything is written into a hidden sibling folder and renamed into place: a reader sees the
whole folder or none of it. ``convergent prune --save`` writes through
:mod:`convergent.commands.pruned_folder`, which adds sizes and speed to its report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.commands.config import TrainConfig
from convergent.commands.hf_reading import (
    HUGGING_FACE,
    folder_kind,
    hf_model_from_compressed,
    quiet_progress,
    save_compressed_config,
)
from convergent.commands.runs import load_run
from convergent.io import fsync_directory, write_text_atomically
from convergent.sparse.storage import (
    COMPRESSED_WEIGHTS,
    CompressedFileError,
    compressed_files,
    group_dims,
    has_compressed_weights,
    write_compressed_file,
)
from convergent.train import holds_a_run, resolve_checkpoint, save_checkpoint
from convergent.wording import option

MIB = 2**20


def is_hugging_face_model(model: nn.Module) -> bool:
    """A ``transformers`` model: it has a config that ``save_pretrained`` can write."""
    return hasattr(getattr(model, "config", None), "save_pretrained")


def check_save_folder(folder: str | Path) -> None:
    """Refuse a folder to save into that holds a run, or anything else: name a new one.

    Raises:
        ValueError: the folder is a file, or a folder that is not empty.
    """
    path = Path(folder)
    flag = option("save_to")
    if path.exists() and not path.is_dir():
        raise ValueError(f"the {flag} folder {path} is a file; name a new folder")
    if holds_a_run(path):
        raise ValueError(f"the {flag} folder {path} already holds a run; name a new folder")
    if path.exists() and any(path.iterdir()):
        raise ValueError(
            f"the {flag} folder {path} already exists and is not empty; name a new folder"
        )


@torch.no_grad()
def positive_zeros_(model: nn.Module) -> None:
    """Write every zero of ``model``'s floating-point weights as +0.0, in place.

    Pruning by ``w * mask`` leaves -0.0 where w was negative; the sign of a zero changes no
    product or sum, but the compressed format keeps it (one bit per zero), so a pruned
    model is written with positive zeros.
    """
    for parameter in model.parameters():
        if parameter.is_floating_point():
            parameter.masked_fill_(parameter == 0, 0.0)


def write_config_files(staging: Path, model: nn.Module, compressed: str | None = None) -> None:
    """A ``transformers`` model's ``config.json`` and, for a model that generates, its
    ``generation_config.json``: what ``save_pretrained`` writes beside the weights. With
    ``compressed`` (the compressed weights file or index) the config names our format
    (`save_compressed_config`)."""
    config: Any = model.config
    with quiet_progress():
        config.architectures = [type(model).__name__]
        if compressed is None:
            config.save_pretrained(staging)
        else:
            save_compressed_config(config, staging, compressed)
        generation = getattr(model, "generation_config", None)
        if generation is not None and model.can_generate():  # type: ignore[operator]
            generation.save_pretrained(staging)


def _write_hugging_face(staging: Path, model: nn.Module, tokenizer: Any, compressed: bool) -> None:
    with quiet_progress():
        if compressed:
            write_config_files(staging, model, COMPRESSED_WEIGHTS)
            write_compressed_file(
                staging / COMPRESSED_WEIGHTS, model.state_dict(), group_dims(model)
            )
        else:
            model.save_pretrained(staging)  # type: ignore[operator]
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)


def write_model_folder(
    folder: str | Path,
    model: nn.Module,
    *,
    compressed: bool = True,
    tokenizer: Any = None,
    run_config: TrainConfig | None = None,
    config_text: str | None = None,
    step: int = 0,
    state: dict[str, Any] | None = None,
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``model`` as a new folder, atomically (see the module docstring).

    Args:
        folder: a new (or empty) folder.
        model: a ``transformers`` model, or one of ours with ``run_config``.
        compressed: compressed weights (else an ordinary ``save_pretrained`` folder or
            checkpoint that other tools read).
        tokenizer: saved beside a Hugging Face model.
        run_config: the run's :class:`TrainConfig`; makes the folder a run folder.
        config_text: the run's ``config.json`` as written (its notes on the defaults it
            chose included), copied as it is; None: written from ``run_config``.
        step: the checkpoint's step (run folders).
        state: what the checkpoint stores beside the weights (run folders), e.g. masks.
        finish: called with the staging folder once the model is written, before the
            rename (to add reports that read the written model).

    Returns:
        The weights' folder: ``folder`` itself, or its checkpoint for a run folder.

    Raises:
        ValueError: a folder in the way, or a model that is neither kind.
    """
    path = Path(folder)
    if run_config is None and not is_hugging_face_model(model):
        raise ValueError(
            f"a {type(model).__name__} is saved as a run folder: pass run_config=, the "
            "TrainConfig that builds it (a transformers model needs none)"
        )
    check_save_folder(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        if run_config is None:
            _write_hugging_face(staging, model, tokenizer, compressed)
            weights = staging
        else:
            write_text_atomically(
                staging / "config.json",
                config_text or json.dumps(dataclasses.asdict(run_config), indent=2) + "\n",
            )
            weights = save_checkpoint(
                staging / "checkpoints", step, model, state or {}, keep=1, compressed=compressed
            )
        if finish is not None:
            finish(staging)
        if path.exists():
            path.rmdir()  # empty, checked above; os.replace cannot replace a folder
        os.replace(staging, path)
        fsync_directory(path.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path / weights.relative_to(staging)


def save_sparse(
    model: nn.Module,
    folder: str | Path,
    *,
    tokenizer: Any = None,
    run_config: TrainConfig | None = None,
    step: int = 0,
    state: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` with compressed weights into a new folder that :func:`load_sparse` and
    the commands read (each pruned matrix as a bitmask and its kept values, or N:M values
    and positions, or dense where that is smaller; see :mod:`convergent.sparse.storage`).

    Args:
        model: a ``transformers`` model (a Hugging Face folder), or one of ours with
            ``run_config`` (a run folder).
        folder: a new (or empty) folder.
        tokenizer: saved beside a Hugging Face model (``prune``, ``diagnose`` and ``bench``
            need it there).
        run_config: the :class:`TrainConfig` of the run the model belongs to.
        step: the checkpoint's step (run folders).
        state: what the checkpoint keeps beside the weights (run folders).

    Returns:
        The folder that holds the weights (a checkpoint folder for a run).
    """
    return write_model_folder(
        folder, model, tokenizer=tokenizer, run_config=run_config, step=step, state=state
    )


def load_sparse(
    folder: str | Path, model_class: Any = None, *, kernels: bool = False, tokens: int = 1
) -> nn.Module:
    """The model of a folder that :func:`save_sparse` (or ``prune --save``) wrote, bit for bit,
    in eval mode. Every checksum is verified before a tensor is loaded.

    Args:
        folder: a Hugging Face folder with ``sparse_model.safetensors``, or a run folder (its
            ``checkpoints/`` folder, or one checkpoint) whose checkpoint is compressed.
        model_class: for a Hugging Face folder, the ``transformers`` class to build (default:
            the one its ``config.json`` names).
        kernels: then put each pruned linear layer on a sparse kernel where a timing on this
            machine, at ``tokens`` rows per forward, shows it faster
            (:func:`~convergent.sparse.kernels.to_sparse_kernels`; inference only).
        tokens: the rows per forward the kernels are timed at (1: token-by-token decoding).

    Raises:
        CompressedFileError: a folder that is not a compressed one, or a damaged file.
        CheckpointError: a run folder whose checkpoints fail verification.
    """
    model = _load_compressed(Path(folder), model_class)
    if kernels:
        from convergent.sparse.kernels import to_sparse_kernels

        to_sparse_kernels(model, tokens=tokens)
    return model


def _load_compressed(path: Path, model_class: Any) -> nn.Module:
    if path.is_dir() and folder_kind(path) == HUGGING_FACE:
        if not has_compressed_weights(path):
            raise CompressedFileError(
                f"{path} holds ordinary weights, not compressed ones; load it with "
                "from_pretrained, or write a compressed folder with save_sparse"
            )
        return hf_model_from_compressed(path, model_class)
    if not path.exists():
        raise CompressedFileError(f"no compressed model folder at {path}: the path does not exist")
    checkpoint = resolve_checkpoint(path)
    if not (checkpoint / COMPRESSED_WEIGHTS).is_file():
        raise CompressedFileError(
            f"the checkpoint {checkpoint} holds ordinary weights, not compressed ones; load it "
            "with convergent.commands.load_run"
        )
    return load_run(path).model.eval()


def weights_files(folder: str | Path) -> list[Path]:
    """The weights files of a Hugging Face or run folder (compressed or not)."""
    path = Path(folder)
    hugging_face = path.is_dir() and folder_kind(path) == HUGGING_FACE
    root = path if hugging_face else resolve_checkpoint(path)
    files = compressed_files(root)
    if files:
        return files
    return sorted(root.glob("model*.safetensors")) or sorted(root.glob("pytorch_model*.bin"))


__all__ = [
    "check_save_folder",
    "load_sparse",
    "positive_zeros_",
    "save_sparse",
    "weights_files",
    "write_model_folder",
]
