"""``convergent train`` on the command line: its flags, one per
:class:`~convergent.commands.config.TrainConfig` field (help and default quoted from the
field), merged over a ``--config`` file into a config for
:func:`~convergent.commands.train.run_training`, and the run's scores (or, stopped by a
signal, the command that continues it) printed."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from convergent.commands.flags import (
    UserError,
    add_mask_spec_arguments,
    field_help,
    mask_spec_from_arguments,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``train`` and its flags to ``commands``."""
    from convergent.commands.config import TrainConfig

    parser = commands.add_parser(
        "train",
        help="train a model on a data source and write a run folder",
        description="Train a model on a data source and score it on the validation split. "
        "Values come from the defaults, then --config FILE.json, then the flags below. "
        "Ctrl-C (or SIGTERM) stops after the step under way with a checkpoint; --resume "
        "continues.",
    )
    parser.add_argument(
        "--config", type=Path, help="a JSON file of settings: the flags' names with underscores"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the run folder (default runs/DATA-MODEL)"
    )
    folder = parser.add_mutually_exclusive_group()
    folder.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in the folder from its newest checkpoint, with its own config "
        "(only --steps, --eval-every, --checkpoint-every and --device may change)",
    )
    folder.add_argument(
        "--overwrite", action="store_true", help="replace a run already in the folder"
    )
    parser.add_argument(
        "--test",
        action="store_true",
        help="also score the test split at the end (leave it unread while you tune)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    choices = _train_choices()
    for field in dataclasses.fields(TrainConfig):
        if field.name == "mask_spec":  # one flag per MaskSpec field, below
            continue
        flag = "--" + field.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str}[str(field.type).split(" | ")[0]]
        help_text = f"{field_help(TrainConfig, field.name).rstrip('.')} {_train_default(field)}"
        if field.name in choices:
            help_text = f"one of {', '.join(choices[field.name])}: {help_text}"
        parser.add_argument(
            flag,
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=help_text.replace("%", "%%"),
        )
    add_mask_spec_arguments(
        parser.add_argument_group(
            "sparse training (with --sparsity): which weights, and the masks' layout"
        )
    )
    parser.set_defaults(handler=run)


def _train_choices() -> dict[str, tuple[str, ...]]:
    """The values a train flag accepts, for --help (the config checks them too)."""
    from convergent.commands.config import (
        MODELS,
        OPTIMIZER_CHOICES,
        PENALTY_CHOICES,
        SPARSITY_SCHEDULES,
    )
    from convergent.data import SPLIT_SOURCES
    from convergent.models.config import NORMS
    from convergent.train.loop import PRECISIONS
    from convergent.train.schedules import SCHEDULES

    return {
        "data": (*SPLIT_SOURCES, "hf:NAME"),
        "model": MODELS,
        "optimizer": OPTIMIZER_CHOICES,
        "villani_penalty": PENALTY_CHOICES,
        "schedule": SCHEDULES,
        "norm": NORMS,
        "precision": PRECISIONS,
        "device": ("auto", "cpu", "cuda"),
        "sparsity_schedule": tuple(SPARSITY_SCHEDULES),
    }


def _train_default(field: dataclasses.Field[Any]) -> str:
    """The default of a train flag, as its help states it: the field's own, a default that
    depends on the run, or the optimizer's own it falls back to."""
    if field.name == "lr":
        from convergent.commands.config import DEFAULT_LEARNING_RATES

        rates = ", ".join(f"{rate:g} for {model}" for model, rate in DEFAULT_LEARNING_RATES.items())
        return f"(default {rates})"
    if field.name == "checkpoint_every":
        from convergent.commands.config import CHECKPOINTS_PER_RUN

        return f"(default: steps / {CHECKPOINTS_PER_RUN}, rounded up)"
    if field.default is not None:
        return f"(default {field.default})"
    if field.name in ("horst_strength", "horst_alpha"):
        from convergent.optim import DEFAULT_STRENGTH

        return f"(neither given: strength {DEFAULT_STRENGTH})"
    if field.name in ("horst_beta", "ham_alpha", "ham_beta"):
        from convergent.optim import optimizer_default

        optimizer, option = field.name.split("_", 1)
        return f"(default: {optimizer.upper()}'s own, {optimizer_default(optimizer, option)})"
    return "(default: none)"


def run(arguments: argparse.Namespace) -> int:
    """``convergent train``'s parsed flags: do the command; returns the exit status."""
    from convergent.commands.config import TrainConfig
    from convergent.commands.runs import resume_config
    from convergent.commands.train import run_training

    values: dict[str, Any] = {}
    if arguments.config is not None:
        if not arguments.config.is_file():
            raise UserError(f"config file {arguments.config} does not exist")
        try:
            values = json.loads(arguments.config.read_text())
        except json.JSONDecodeError as error:
            raise UserError(f"config file {arguments.config} is not valid JSON: {error}") from None
    for field in dataclasses.fields(TrainConfig):
        if field.name != "mask_spec" and getattr(arguments, field.name) is not None:
            values[field.name] = getattr(arguments, field.name)
    sparse_flags = _sparse_training_flags(arguments)
    if sparse_flags and not values.get("sparsity"):
        raise UserError(
            f"{', '.join(sparse_flags)} {'apply' if len(sparse_flags) > 1 else 'applies'} to"
            " sparse training only; add --sparsity S with S in (0, 1), got"
            f" {values.get('sparsity')}"
        )
    if any(not flag.startswith("--sparsity-schedule") for flag in sparse_flags) or (
        "mask_spec" in values
    ):
        values["mask_spec"] = _train_mask_spec(values.get("mask_spec"), arguments)
    config = TrainConfig.from_dict(values)
    run_dir = (
        arguments.out
        or Path("runs") / f"{config.data.replace(':', '-').replace('/', '_')}-{config.model}"
    )
    if arguments.resume:
        config = resume_config(run_dir, values)
    summary = run_training(
        config,
        run_dir,
        resume=arguments.resume,
        overwrite=arguments.overwrite,
        progress=not arguments.no_progress,
        score_test=arguments.test,
        given=values,
    )
    reports = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 reports for all
    if "interrupted" in summary:
        return _report_interrupted(summary["interrupted"], run_dir, reports)
    if not reports:
        return 0
    validation = summary["validation"]
    score = "accuracy" if "accuracy" in validation else "rmse"
    scores = [f"validation {score} {validation[score]:.4f}", f"loss {validation['loss']:.4f}"]
    if "test" in summary:
        test = summary["test"]
        scores += [f"test {score} {test[score]:.4f}", f"test loss {test['loss']:.4f}"]
    print(
        f"{config.model} on {config.data}: {', '.join(scores)}"
        f" ({summary['steps']} steps, {summary['seconds']} s)"
    )
    sparsity = summary.get("sparsity")
    if sparsity is not None:
        spec = sparsity["mask_spec"]
        print(
            f"sparsity {sparsity['achieved']:.4f} of {sparsity['prunable_weights']} prunable weight"
            f" matrices ({sparsity['method']}, target {sparsity['target']:g},"
            f" {spec['distribution']} {spec['pattern']})"
        )
    print(f"run folder: {run_dir}")
    return 0


# The exit status of a run stopped by a signal: 128 + its number, as a shell reports it.
_INTERRUPTED_STATUS = {"SIGINT": 130, "SIGTERM": 143}


def _report_interrupted(interrupted: dict[str, Any], run_dir: Path, reports: bool) -> int:
    """Say (if this process ``reports``) where a stopped run's work is and the exact command
    that continues it; returns the exit status."""
    import shlex

    if not reports:
        return _INTERRUPTED_STATUS[interrupted["signal"]]

    world = int(os.environ.get("WORLD_SIZE", "1"))
    launcher = (
        f"torchrun --standalone --nproc_per_node {world} -m convergent"
        if world > 1
        else "convergent"
    )
    print(
        f"stopped by {interrupted['signal']} at step {interrupted['step']} of"
        f" {interrupted['steps']}; checkpoint: {interrupted['checkpoint']}\n"
        f"continue with: {launcher} train --out {shlex.quote(str(run_dir))} --resume",
        file=sys.stderr,
    )
    return _INTERRUPTED_STATUS[interrupted["signal"]]


def _sparse_training_flags(arguments: argparse.Namespace) -> list[str]:
    """The sparse-training flags given (``--sparsity-schedule`` and the mask spec's), each
    with its value."""
    from convergent.sparse import MaskSpec

    names = ["sparsity_schedule", *(field.name for field in dataclasses.fields(MaskSpec))]
    return [
        f"--{name.replace('_', '-')} {getattr(arguments, name)}"
        for name in names
        if getattr(arguments, name, None) is not None
    ]


def _train_mask_spec(from_file: dict[str, Any] | None, arguments: argparse.Namespace) -> Any:
    """The mask spec of ``train``: the --config file's ``mask_spec`` fields, replaced by the
    mask-spec flags given."""
    from convergent.sparse import MaskSpec

    if from_file is not None and not isinstance(from_file, dict):
        raise UserError(
            f"mask_spec in the config file must be an object of MaskSpec fields, got {from_file!r}"
        )
    flags = mask_spec_from_arguments(arguments)
    given = {
        field.name: getattr(flags, field.name)
        for field in dataclasses.fields(MaskSpec)
        if getattr(arguments, field.name, None) is not None
    }
    return MaskSpec.from_dict(from_file or {}).replace(**given)
