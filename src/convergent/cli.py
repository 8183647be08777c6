"""The ``convergent`` command: the only place that parses configuration.

User mistakes (an unknown source, a value out of range, a missing checkpoint) print one
sentence and exit with status 2; set ``CONVERGENT_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convergent import __version__

USER_ERROR_STATUS = 2


class UserError(Exception):
    """A mistake in what the user asked for; reported as one sentence, no traceback."""


def _user_error_types() -> tuple[type[BaseException], ...]:
    from convergent.data import DataSourceError
    from convergent.train import CheckpointError, TrainingDiverged

    return (
        UserError,
        ValueError,
        DataSourceError,
        CheckpointError,
        FileNotFoundError,
        TrainingDiverged,
    )


def _add_train(commands: argparse._SubParsersAction) -> None:
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
        help_text = f"{_field_help(TrainConfig, field.name).rstrip('.')} {_train_default(field)}"
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
    parser.set_defaults(handler=_train)


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


def _train(arguments: argparse.Namespace) -> int:
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


def _add_data(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("data", help="list and fetch the offline data sources")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="each source and whether it is cached").set_defaults(
        handler=_data_list
    )
    fetch = actions.add_parser("fetch", help="fetch sources into the cache")
    fetch.add_argument(
        "names", nargs="+", metavar="NAME", help="the sources to fetch ('convergent data list')"
    )
    fetch.add_argument("--force", action="store_true", help="fetch again even if cached")
    fetch.set_defaults(handler=_data_fetch)


def _data_list(arguments: argparse.Namespace) -> int:
    from convergent.data import GENERATED_SOURCES, cache_root, describe_sources

    rows = describe_sources()
    width = max(len(name) for name in [*(row["name"] for row in rows), *GENERATED_SOURCES])
    for row in rows:
        state = "cached" if row["cached"] else "not cached"
        size = f"{row['size'] / 1e6:8.1f} MB" if row.get("size") else " " * 11
        print(f"{row['name']:<{width}}  {state:<10}  {size}  {row['description']}")
    for name, description in GENERATED_SOURCES.items():
        print(f"{name:<{width}}  {'generated':<10}  {'':11}  {description}")
    print(
        f"{'hf:NAME':<{width}}  {'':<10}  {'':11}  a Hugging Face dataset by name (online) or a local file"
    )
    print(f"cache: {cache_root()}")
    return 0


def _data_fetch(arguments: argparse.Namespace) -> int:
    from convergent.data import GENERATED_SOURCES, fetch

    for name in arguments.names:
        if name in GENERATED_SOURCES:
            print(f"{name}: generated locally when loaded; nothing to fetch")
            continue
        path = fetch(name, force=arguments.force)
        print(f"{name}: {path}")
    return 0


def _add_reproduce(commands: argparse._SubParsersAction) -> None:
    from convergent.studies import MODES, STUDIES

    parser = commands.add_parser(
        "reproduce",
        help="run a paper-reproduction study (or all of them) and write its report",
        description="Run studies: " + ", ".join(sorted(STUDIES)) + ". Each writes report.md, "
        "results.json and PNG figures under OUT/NAME.",
    )
    parser.add_argument("names", nargs="+", metavar="STUDY", help="study names, or 'all'")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--mode",
        choices=MODES,
        default="quick",
        help="how big a study runs: smoke (seconds: it runs), quick (minutes, one seed) or full"
        " (hours) (default quick)",
    )
    for mode in MODES:
        size.add_argument(
            f"--{mode}",
            dest="mode",
            action="store_const",
            const=mode,
            help=f"same as --mode {mode}",
        )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/studies"),
        help="where reports go: OUT/NAME (default runs/studies)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="run N final seeds: the mode's own, cut or continued upward (skipping the seeds a "
        "study tunes with), so a larger N reuses a finished run's units",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--pilot",
        action="store_true",
        help="run (or resume) the study's regime pilot on the validation split instead (descent, "
        "sparsity), writing OUT/NAME-pilot/pilot.json",
    )
    parser.set_defaults(handler=_reproduce)


def _reproduce(arguments: argparse.Namespace) -> int:
    from convergent.studies import STUDIES, run_study, write_index

    names = sorted(STUDIES) if arguments.names == ["all"] else list(arguments.names)
    for name in names:
        if name not in STUDIES:
            from convergent.wording import did_you_mean

            raise UserError(
                f"unknown study {name!r}{did_you_mean(name, [*STUDIES, 'all'])}; the studies are:"
                f" {', '.join(sorted(STUDIES))}, all"
            )
    if arguments.seeds is not None and arguments.seeds < 1:
        raise UserError(f"--seeds must be a positive integer, got {arguments.seeds}")
    if arguments.pilot:
        return _pilot(names, arguments.out, not arguments.no_progress)
    results = []
    for name in names:
        print(f"{name} ({arguments.mode}): running, report into {arguments.out / name}", flush=True)
        result = run_study(
            name,
            arguments.mode,
            arguments.out,
            progress=not arguments.no_progress,
            seeds=arguments.seeds,
        )
        results.append(result)
        print(
            f"{name} ({arguments.mode}): {arguments.out / name / 'report.md'} ({result.seconds:.0f} s)"
        )
        for claim in result.claims:
            print(f"  [{claim.label}] {claim.statement}: {claim.summary()}")
        sys.stdout.flush()
    if len(results) > 1:
        print(f"index: {write_index(results, arguments.out)}")
    return 0


def _pilot(names: list[str], out: Path, progress: bool) -> int:
    import json

    from convergent.io import write_text_atomically
    from convergent.studies import get_study
    from convergent.studies.framework import PilotedStudy, json_ready

    piloted = [study for study in map(get_study, names) if isinstance(study, PilotedStudy)]
    if len(names) != 1 or len(piloted) != 1:
        raise UserError(
            f"--pilot runs one study that has a pilot (descent or sparsity), got {', '.join(names)}"
        )
    (name,), (study,) = names, piloted
    folder = out / f"{name}-pilot"
    result = study.run_pilot(folder, log=print if progress else lambda line: None)
    path = folder / "pilot.json"
    write_text_atomically(path, json.dumps(json_ready(result), indent=2) + "\n")
    print(f"{name} pilot: {path} (chosen: {result['chosen']}, used: {result['used']})")
    return 0


def _add_report(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report",
        help="the results section of a README, generated from study reports",
        description="Read every NAME/results.json under FOLDER and print the results section"
        " (each claim with its verdict, effect, interval, seeds and manipulation checks), or"
        " write it into a README between its results markers.",
    )
    parser.add_argument("folder", type=Path, help="a folder of study reports, e.g. docs/results")
    parser.add_argument(
        "--readme", type=Path, default=None, help="rewrite this README's results section"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --readme: write nothing, exit 1 if the README's section is out of date",
    )
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="first re-score every report's claims from its results.json (numbers unchanged)",
    )
    parser.set_defaults(handler=_report)


def _report(arguments: argparse.Namespace) -> int:
    from convergent.studies import rescore, study_summary
    from convergent.studies.framework import OtherDesign
    from convergent.studies.framework.readme import results_section, update_readme

    if not arguments.folder.is_dir():
        raise UserError(f"{arguments.folder} is not a folder of study reports")
    if arguments.check and arguments.readme is None:
        raise UserError("--check needs --readme README to compare with")
    if arguments.rescore:
        for path in sorted(arguments.folder.glob("*/results.json")):
            try:
                result = rescore(path.parent)
            except OtherDesign as refused:
                print(f"left {path.parent} as scored then: {refused}")
                continue
            print(f"re-scored {path.parent}: {len(result.claims)} claims")
    if arguments.readme is None:
        print(results_section(arguments.folder, summarize=study_summary), end="")
        return 0
    current = update_readme(
        arguments.readme, arguments.folder, check=arguments.check, summarize=study_summary
    )
    if arguments.check:
        state = "up to date" if current else "out of date; run without --check to rewrite it"
        print(f"{arguments.readme}: results section {state}")
        return 0 if current else 1
    print(f"{arguments.readme}: results section {'unchanged' if current else 'rewritten'}")
    return 0


def _field_help(cls: type, name: str) -> str:
    """The text of attribute ``name`` in ``cls``'s docstring (its Attributes section)."""
    lines = (cls.__doc__ or "").splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith(f"{name}:"):
            text = [line.strip()[len(name) + 1 :].strip()]
            for following in lines[index + 1 :]:
                if not following.startswith(" " * 12):
                    break
                text.append(following.strip())
            return " ".join(text).replace("``", "")
    return ""


# MaskSpec fields that only one-shot pruning reads (OWL's allocation): not `train` flags.
ONE_SHOT_FIELDS = ("owl_m", "owl_lmbda")


def add_mask_spec_arguments(group: Any, one_shot: bool = False) -> None:
    """One flag per :class:`~convergent.sparse.MaskSpec` field (their defaults are the spec's,
    quoted from it): ``--distribution``, ``--pattern``, ``--include-embeddings``, ...,
    ``--exclude NAME`` (repeatable); with ``one_shot``, OWL's ``--owl-m`` and
    ``--owl-lmbda`` and the ``owl`` distribution too."""
    from convergent.sparse import DISTRIBUTIONS, MaskSpec

    for field in dataclasses.fields(MaskSpec):
        if field.name in ONE_SHOT_FIELDS and not one_shot:
            continue
        flag = "--" + field.name.replace("_", "-")
        help_text = (
            f"{_field_help(MaskSpec, field.name).rstrip('.')} {_spec_default(field.default)}"
        )
        if isinstance(field.default, bool):
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif field.name == "exclude":
            group.add_argument(flag, action="append", default=None, metavar="NAME", help=help_text)
        elif isinstance(field.default, float):
            group.add_argument(flag, type=float, default=None, help=help_text)
        else:
            choices = None
            if field.name == "distribution":
                choices = (
                    DISTRIBUTIONS if one_shot else tuple(d for d in DISTRIBUTIONS if d != "owl")
                )
            group.add_argument(flag, choices=choices, default=None, help=help_text)


def _spec_default(value: Any) -> str:
    """A mask option's default as its flag's help says it."""
    if isinstance(value, bool):
        return f"(default: {'on' if value else 'off'})"
    return f"(default {value})" if value else "(default: none)"


def mask_spec_from_arguments(arguments: argparse.Namespace) -> Any:
    """The :class:`~convergent.sparse.MaskSpec` of the flags given (the others: its defaults)."""
    from convergent.sparse import MaskSpec

    given = {
        field.name: getattr(arguments, field.name)
        for field in dataclasses.fields(MaskSpec)
        if getattr(arguments, field.name, None) is not None
    }
    if "exclude" in given:
        given["exclude"] = tuple(given["exclude"])
    return MaskSpec(**given)


def _add_prune(commands: argparse._SubParsersAction) -> None:
    from convergent.commands.prune import DEFAULT_SPARSITIES, prune_hf_folder
    from convergent.sparse import METHODS

    parser = commands.add_parser(
        "prune",
        help="one-shot pruning (magnitude, Wanda, SparseGPT) of a trained run or a Hugging Face"
        " model folder",
        description="Prune a run folder (or checkpoint) written by 'convergent train', or a"
        " Hugging Face save_pretrained folder (a causal LM or a sequence classifier), one-shot"
        " by weight magnitude, Wanda or SparseGPT, and report validation"
        " loss/accuracy/perplexity at each sparsity.",
    )
    parser.add_argument(
        "path",
        type=Path,
        help="a run folder, its checkpoints folder, a checkpoint, or a save_pretrained folder",
    )
    parser.add_argument(
        "--sparsity",
        type=float,
        action="append",
        help="target in [0, 1); repeat for several (default "
        f"{' '.join(map(str, DEFAULT_SPARSITIES))}; N:M patterns prune 1 - N/M)",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="magnitude",
        help="magnitude (no data), or wanda / sparsegpt, calibrated block by block",
    )
    placement = parser.add_argument_group("where and how the model is pruned")
    placement.add_argument(
        "--device",
        default=None,
        help="where each block is calibrated, pruned and evaluated: cpu, cuda or cuda:N (the"
        " model stays in CPU memory; default: where it loads, the CPU)",
    )
    placement.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="load, prune and save the model in this dtype; statistics are float64 whatever it"
        " is (default: the checkpoint's own)",
    )
    placement.add_argument(
        "--low-memory",
        action="store_true",
        help="a Hugging Face folder larger than memory: stream its blocks from its safetensors"
        " files, one in memory at a time, writing each pruned block to --save (one"
        " --sparsity per call)",
    )
    calibration = parser.add_argument_group("Wanda and SparseGPT calibration")
    calibration.add_argument(
        "--calibration-data",
        default=None,
        help="the source whose train split they calibrate on (default: --data's; a run uses its"
        " own training split)",
    )
    calibration.add_argument(
        "--calibration-examples",
        type=int,
        default=None,
        help=f"training examples to calibrate on (default "
        f"{_keyword_defaults(prune_hf_folder)['calibration_examples']})",
    )
    add_mask_spec_arguments(
        parser.add_argument_group("which weights, and the masks' layout"), one_shot=True
    )
    parser.add_argument(
        "--save",
        type=Path,
        default=None,
        help="write the model pruned at the last sparsity into this new folder, its weights"
        " compressed (load it with convergent.commands.load_sparse), with pruning.json,"
        " pruning.md (sizes, and bench's speed and memory) and pruning.png",
    )
    parser.add_argument(
        "--dense",
        action="store_true",
        help="with --save: write ordinary weights (model.safetensors) that other tools read",
    )
    parser.add_argument(
        "--no-bench",
        action="store_true",
        help="with --save: leave bench's speed and memory figures out of pruning.md",
    )
    hugging_face = parser.add_argument_group("Hugging Face model folders only")
    hugging_face.add_argument(
        "--data",
        default=None,
        help="the data to evaluate on (default austen for a causal LM, rt-sentences for a"
        " classifier; also hf:NAME)",
    )
    hugging_face.add_argument(
        "--examples",
        type=int,
        default=None,
        help="evaluate on the first this many validation examples (default: all)",
    )
    defaults = _keyword_defaults(prune_hf_folder)
    hugging_face.add_argument(
        "--max-length",
        type=int,
        default=None,
        help=f"tokens per example (default {defaults['max_length']})",
    )
    hugging_face.add_argument(
        "--seed",
        type=int,
        default=None,
        help=f"seeds the data's split into train, validation and test (default {defaults['seed']})",
    )
    parser.set_defaults(handler=_prune)


def _keyword_defaults(function: Any) -> dict[str, Any]:
    """The defaults of ``function``'s parameters, so that help texts quote them from their one
    definition."""
    import inspect

    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


# Options of `prune` that only a Hugging Face folder takes: a run brings its own data.
HF_ONLY = ("data", "examples", "max_length", "seed", "calibration_data")


# Options of `prune` that only a Hugging Face folder takes, beside HF_ONLY's data options.
HF_ONLY_FLAGS = ("low_memory",)


def _prune(arguments: argparse.Namespace) -> int:
    import torch

    from convergent.commands.hf_folders import HUGGING_FACE, folder_kind
    from convergent.commands.prune import prune_hf_folder, prune_run
    from convergent.commands.pruned_folder import SaveOptions
    from convergent.commands.pruning_report import format_prune_summary

    if (arguments.dense or arguments.no_bench) and arguments.save is None:
        raise UserError("--dense and --no-bench apply to --save FOLDER only; add --save")
    options: dict[str, Any] = {
        "spec": mask_spec_from_arguments(arguments),
        "method": arguments.method,
        "save_to": arguments.save,
        "save": SaveOptions(dense=arguments.dense, bench=not arguments.no_bench),
        "device": arguments.device,
        "dtype": None if arguments.dtype is None else getattr(torch, arguments.dtype),
        "progress": True,
    }
    if arguments.calibration_examples is not None:
        options["calibration_examples"] = arguments.calibration_examples
    sparsities = tuple(arguments.sparsity) if arguments.sparsity else None
    if folder_kind(arguments.path) == HUGGING_FACE:
        options["low_memory"] = arguments.low_memory
        given = {name: getattr(arguments, name) for name in HF_ONLY}
        # Options left out take prune_hf_folder's own defaults (defined there, once).
        chosen = {name: value for name, value in given.items() if value is not None}
        summary = prune_hf_folder(arguments.path, sparsities, **chosen, **options)
    else:
        flags = [
            f"--{name.replace('_', '-')}"
            for name in HF_ONLY
            if getattr(arguments, name) is not None
        ] + [f"--{name.replace('_', '-')}" for name in HF_ONLY_FLAGS if getattr(arguments, name)]
        if flags and arguments.path.exists():  # a missing path gets its own error
            raise UserError(
                f"{', '.join(flags)} {'apply' if len(flags) > 1 else 'applies'} only to "
                f"Hugging Face model folders; the run at "
                f"{arguments.path} brings its own data (scored on its validation split, "
                "calibrated on its training split)"
            )
        summary = prune_run(arguments.path, sparsities, **options)
    print(format_prune_summary(summary))
    return 0


def _add_bench(commands: argparse._SubParsersAction) -> None:
    from convergent.commands.benchmark import DEVICES, LENGTHS

    parser = commands.add_parser(
        "bench",
        help="forward speed, file size and peak memory of a model, dense against sparse kernels",
        description="Time a [1, T] forward pass (no KV cache) dense and through sparse kernels"
        " (each pruned layer on the faster of the two, timed at T tokens), compare the weights'"
        " size dense and compressed, and measure peak memory in one fresh process per variant.",
    )
    parser.add_argument(
        "path",
        type=Path,
        help="a run folder, its checkpoints folder, a checkpoint, or a save_pretrained folder"
        " (compressed or not)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="the torch threads every variant is timed with (default: torch's own setting)",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the dense and sparse forwards are timed (default cpu)",
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=list(LENGTHS),
        metavar="T",
        help=f"tokens per forward (default {' '.join(map(str, LENGTHS))})",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.set_defaults(handler=_bench)


def _bench(arguments: argparse.Namespace) -> int:
    from convergent.commands.benchmark import bench, format_bench
    from convergent.io import write_text_atomically

    result = bench(
        arguments.path,
        threads=arguments.threads,
        device=arguments.device,
        lengths=arguments.lengths,
        memory=not arguments.no_memory,
    )
    if arguments.json is not None:
        write_text_atomically(arguments.json, json.dumps(result, indent=2) + "\n")
    print(format_bench(result), end="")
    return 0


def _add_diagnose(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "diagnose",
        help="convergence diagnostics of a run, a checkpoint, a Hugging Face model folder or"
        " MiniLM: a report folder",
        description="Write a markdown summary and PNG plots: layer-wise loss, attention-output"
        " spectra per layer, rank collapse, weight histograms and sparsity, W_Q/W_K norms.",
    )
    parser.add_argument(
        "path",
        help="a run folder, its checkpoints folder, a checkpoint, a save_pretrained folder,"
        " or 'minilm'",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="the data source to diagnose on (default: a run's own; for a Hugging Face folder "
        "the data prune scored it on, else austen for a causal LM, rt-sentences for a "
        "classifier; minilm needs one)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the report folder to write (default RUN/diagnostics)",
    )
    parser.add_argument("--examples", type=int, default=64, help="examples in the diagnostic batch")
    parser.add_argument(
        "--seed", type=int, default=None, help="seeds the data's split (default: the run's own)"
    )
    parser.add_argument("--max-length", type=int, default=64, help="tokens per text example")
    parser.set_defaults(handler=_diagnose)


def _diagnose(arguments: argparse.Namespace) -> int:
    from convergent.commands.diagnose import diagnose

    out = arguments.out
    if out is None:
        name = (arguments.data or "").replace(":", "-").replace("/", "_")
        out = (
            Path(f"diagnostics-minilm-{name}")
            if arguments.path == "minilm"
            else Path(arguments.path) / "diagnostics"
        )
    summary = diagnose(
        arguments.path,
        arguments.data,
        out,
        examples=arguments.examples,
        seed=arguments.seed,
        max_length=arguments.max_length,
    )
    print(f"diagnostics: {summary}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, which also says "did you mean ...?" for a misspelled choice."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            from convergent.wording import did_you_mean

            choices = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r} (choose from {choices})"
                f"{did_you_mean(value, map(str, action.choices))}",
            )


def new_parser() -> argparse.ArgumentParser:
    """The top parser of the ``convergent`` command, without its commands."""
    parser = _Parser(
        prog="convergent",
        description="Train Transformers whose training dynamics you can trust.",
    )
    parser.add_argument("--version", action="version", version=f"convergent {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    return parser


def add_commands(parser: Any) -> None:
    """Add every command to ``parser`` (a :func:`new_parser`, or a recording of one, see
    :mod:`convergent.cli_help`)."""
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train(commands)
    _add_data(commands)
    _add_prune(commands)
    _add_bench(commands)
    _add_diagnose(commands)
    _add_reproduce(commands)
    _add_report(commands)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``convergent`` command."""
    parser = new_parser()
    add_commands(parser)
    return parser


# Options whose flag is not their keyword name with dashes, for messages (see wording.option).
_FLAG_NAMES = {"save_to": "--save", "run_dir": "--out"}


def _command_options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    """The keyword names of the options of ``command``: its subparser's destinations, and the
    names that ``_FLAG_NAMES`` spells as one of its flags."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            dests = {option.dest for option in action.choices[command]._actions}
            aliases = {
                name
                for name, flag in _FLAG_NAMES.items()
                if flag.removeprefix("--").replace("-", "_") in dests
            }
            return dests | aliases
    return set()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    from convergent.cli_help import asks_for_help, print_recorded_help
    from convergent.wording import command_line

    words = sys.argv[1:] if argv is None else list(argv)
    if asks_for_help(words):
        print_recorded_help(new_parser, words)  # exits, unless there is no record to replay
    parser = build_parser()
    arguments = parser.parse_args(words)
    logging.basicConfig(
        level=logging.INFO if arguments.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with command_line(_command_options(parser, arguments.command), _FLAG_NAMES):
        if os.environ.get("CONVERGENT_DEBUG"):
            return int(arguments.handler(arguments))
        try:
            return int(arguments.handler(arguments))
        except _user_error_types() as error:
            text = str(error).strip()
            message = text.splitlines()[0] if text else type(error).__name__
            print(f"convergent: error: {message}", file=sys.stderr)
            return USER_ERROR_STATUS
        except KeyboardInterrupt:
            print("convergent: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
