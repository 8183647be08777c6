"""Run folders of ``convergent train``: find one, read its config, rebuild its model.

A run folder holds ``config.json`` and ``checkpoints/``; ``diagnose`` and ``prune`` accept the
folder, its ``checkpoints/`` folder or one checkpoint, and rebuild the model the config
describes before loading the newest (or the named) checkpoint's weights.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from convergent.commands.config import NOTES, TrainConfig, build_model, split_options
from convergent.data import Splits, load_splits
from convergent.train import CheckpointError, holds_a_run, load_checkpoint, resolve_checkpoint
from convergent.wording import has_option, option

__all__ = [
    "RESUMABLE",
    "LoadedRun",
    "RunFolderError",
    "find_run_folder",
    "load_run",
    "prepare_new_run",
    "read_run_config",
    "resume_config",
]

PARENTS_SEARCHED = 3
# What `convergent train` writes into a run folder; --overwrite removes these and nothing else.
RUN_CONTENTS = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "loss_curve.png",
    "checkpoints",
    "tensorboard",
)
# The settings that may change when a run is resumed: how long it runs and how it reports.
RESUMABLE = ("steps", "eval_every", "checkpoint_every", "device")


class RunFolderError(ValueError):
    """A run folder cannot be used as asked (occupied, empty, or a resume that conflicts)."""


def prepare_new_run(folder: str | Path, *, overwrite: bool = False) -> None:
    """Make ``folder`` ready for a new run: refuse one that holds a run, unless ``overwrite``
    (then the earlier run's files are removed; other files in the folder are left alone)."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"the run folder {path} is a file; name a folder for the run")
    if not (path / "config.json").is_file() and not holds_a_run(path):
        return
    if not overwrite:
        raise RunFolderError(
            f"{path} already holds a run; pass "
            + ", ".join(
                f"{option(name, *value)} {what}"
                for name, value, what in (
                    ("resume", (True,), "to continue it"),
                    ("overwrite", (True,), "to replace it"),
                    ("run_dir", (), "to choose another folder"),
                )
                if has_option(name)
            )
        )
    for name in RUN_CONTENTS:
        target = path / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def resume_config(folder: str | Path, requested: dict[str, Any]) -> TrainConfig:
    """The config to resume the run in ``folder`` with: its own ``config.json``, changed only
    where ``requested`` (the flags given) changes a setting in ``RESUMABLE``.

    Raises:
        RunFolderError: no run or no checkpoint in ``folder``, or a requested setting that
            conflicts with the run's own.
    """
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise RunFolderError(
            f"nothing to resume in {path}: it holds no run (no config.json); train without "
            f"{option('resume', True)}"
        )
    stored = read_run_config(path)
    try:
        step = int(load_checkpoint(path)["step"])
    except CheckpointError:
        raise RunFolderError(
            f"{path} has no checkpoint to resume from; pass {option('overwrite', True)} instead"
            f" of {option('resume', True)} to "
            "start the run again"
        ) from None
    for name, value in requested.items():
        if name not in RESUMABLE and name != NOTES and value != getattr(stored, name):
            raise RunFolderError(
                f"{option(name, value)} conflicts with the run's own {name} "
                f"({getattr(stored, name)}); on resume only "
                f"{', '.join(option(n) for n in RESUMABLE)} may change"
            )
    steps = requested.get("steps", stored.steps)
    if steps < step:
        raise RunFolderError(
            f"{option('steps', steps)} is below the step of the run's checkpoint ({step}); "
            f"pass {option('steps', step)} or more"
        )
    return dataclasses.replace(stored, **{n: v for n, v in requested.items() if n in RESUMABLE})


def find_run_folder(path: str | Path) -> Path:
    """The run folder that ``path`` (a run, its checkpoints folder or a checkpoint) is in."""
    candidate = Path(path)
    for folder in (candidate, *list(candidate.parents)[:PARENTS_SEARCHED]):
        if (folder / "config.json").is_file():
            return folder
    raise CheckpointError(
        f"{candidate} is not a convergent run: no config.json in it or in its "
        f"{PARENTS_SEARCHED} parent folders (pass a run folder written by `convergent train`)"
    )


def read_run_config(folder: str | Path) -> TrainConfig:
    """The :class:`TrainConfig` stored in a run folder's ``config.json``."""
    path = Path(folder) / "config.json"
    try:
        return TrainConfig.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path} is not a convergent train config: {error}") from None


@dataclass
class LoadedRun:
    """A run's model with its checkpoint's weights, the data splits it was rebuilt for, and
    what the checkpoint stored beside the weights (``state``)."""

    model: nn.Module
    splits: Splits
    config: TrainConfig
    checkpoint: Path
    state: dict[str, Any]


def load_run(path: str | Path, data_name: str | None = None, seed: int | None = None) -> LoadedRun:
    """Rebuild the model of a run folder (or checkpoint) and load its newest weights.

    Args:
        path: a run folder, its ``checkpoints/`` folder or one checkpoint folder.
        data_name: the data to build splits of (default: the run's own).
        seed: the split seed (default: the run's own).

    Raises:
        CheckpointError: when the path is missing, not one of our runs, or its weights do
            not fit the model its config describes.
    """
    candidate = Path(path)
    if not candidate.exists():
        raise CheckpointError(f"no run or checkpoint at {candidate}: the path does not exist")
    checkpoint = resolve_checkpoint(candidate)
    config = read_run_config(find_run_folder(candidate))
    data = config.data if data_name is None else data_name
    splits = load_splits(
        data,
        seed=config.seed if seed is None else seed,
        **split_options(data, config.max_length),
    )
    model = build_model(config, splits)
    try:
        state = load_checkpoint(checkpoint, model)
    except RuntimeError as error:  # safetensors reports shape mismatches as RuntimeError
        if isinstance(error, CheckpointError):
            raise
        lines = str(error).strip().splitlines()
        raise CheckpointError(
            f"checkpoint {checkpoint} does not fit the model its config.json describes"
            f" ({lines[-1].strip() if lines else type(error).__name__})"
        ) from None
    return LoadedRun(model, splits, config, checkpoint, state)
