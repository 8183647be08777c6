"""``convergent train``: a frozen config in, a run folder out.

A command in the torchtune sense: the config object stops here, and everything below it
(data loaders, models, optimizers, :func:`~convergent.train.fit`) takes plain arguments.
A run folder holds ``config.json``, ``metrics.jsonl``, ``tensorboard/``, ``checkpoints/``,
``summary.json`` and ``loss_curve.png``. A sparse config (``sparsity`` > 0) wraps the run's
objective (ERM or regularized) in a :class:`~convergent.train.MaskedStep`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import transformers

from convergent.commands.config import (
    NOTES,
    SPARSITY_SCHEDULES,
    TrainConfig,
    build_masked_step,
    build_model,
    check_device,
    chosen_defaults,
    optimizer_options,
    split_options,
)
from convergent.commands.runs import RunFolderError, prepare_new_run, resume_config
from convergent.data import load_splits
from convergent.io import write_text_atomically
from convergent.optim import HORST, build_optimizer, decay_groups
from convergent.regularize import VillaniRegularizer
from convergent.report import plot_training_curves
from convergent.train import (
    ErmStep,
    MaskedStep,
    RegularizedStep,
    TrainingStep,
    distributed,
    evaluate,
    fit,
    read_metrics,
    seed_everything,
    warmup_schedule,
)
from convergent.train.callbacks import HorstStrengthLog

logger = logging.getLogger(__name__)
# The signals that stop a run with a checkpoint instead of killing it.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """While the ``with`` block runs, SIGINT and SIGTERM ask training to stop after the step
    under way (call the object to ask whether one arrived); the first one restores the usual
    handlers, so a second signal stops the process at once. Outside the main thread, where
    Python cannot take signals, it does nothing."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        return self.received is not None

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
            for number in STOP_SIGNALS:
                signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _handle(self, number: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(number).name
        self._restore()
        print(
            f"convergent: {self.received} received: stopping after this step with a checkpoint"
            f" (send it again to stop at once, without one)",
            file=sys.stderr,
            flush=True,
        )


def run_training(
    config: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    score_test: bool = False,
    given: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Train, evaluate on validation data (and test data when asked), and fill ``run_dir``.

    SIGINT (Ctrl-C) or SIGTERM while training stops the run after the step under way: it
    writes a checkpoint there and returns ``{"interrupted": {"signal", "step", "steps",
    "checkpoint"}}`` instead of a summary (no ``summary.json`` is written); ``resume=True``
    continues it. A second signal stops at once, as usual.

    Args:
        config: the run's settings (on resume, see :func:`~convergent.commands.resume_config`).
        run_dir: the run folder. A folder that already holds a run is refused unless
            ``resume`` (continue from its newest checkpoint) or ``overwrite`` (start again).
        resume: continue the run in ``run_dir``; its checkpoint must exist.
        overwrite: remove an earlier run's files from ``run_dir`` first.
        progress: show progress bars.
        score_test: also score the test split at the end (leave it unread while you tune).
        given: the settings the user gave; ``config.json`` notes the run-dependent defaults
            chosen for the others (None: every field counts as given).

    Returns:
        The summary also written to ``summary.json``.

    A sparse run resumes with its own ``steps`` unless its masks are fixed: AC/DC's phases
    and GMP's ramp are laid over the run's length.

    Launched by ``torchrun`` (``torchrun --nproc_per_node N -m convergent train ...``), it
    trains with DDP: ``batch_size`` stays the global batch, rank 0 writes the run folder.
    """
    folder = Path(run_dir)
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other; pass one of them")
    check_device(config.device)
    # Under torchrun: start the process group here (unless the caller did) and end it after.
    owns_group = not torch.distributed.is_initialized() and distributed.init_from_environment(
        "gloo" if config.device == "cpu" else None
    )
    if resume:
        stored = resume_config(folder, {})  # refuses a folder with no run or no checkpoint
        _check_sparse_resume(config, stored)
    elif distributed.is_main_process():
        prepare_new_run(folder, overwrite=overwrite)
    distributed.barrier()  # no rank writes before rank 0 has cleared an overwritten run
    bars = transformers.utils.logging.is_progress_bar_enabled()
    if not progress:
        transformers.utils.logging.disable_progress_bar()  # the weight-loading bar
    try:
        summary = _train_and_report(
            config,
            folder,
            resume=resume,
            progress=progress,
            score_test=score_test,
            notes=None if given is None else chosen_defaults(config, given),
        )
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    if owns_group:  # not after a failure: a failed rank's peers may never reach the barrier
        distributed.shutdown()
    return summary


def _check_sparse_resume(config: TrainConfig, stored: TrainConfig) -> None:
    """Refuse to stretch a sparse schedule laid over the run's steps (fixed masks may)."""
    if config.sparse and config.sparsity_schedule != "fixed" and config.steps != stored.steps:
        raise RunFolderError(
            f"--steps {config.steps} would change the {SPARSITY_SCHEDULES[config.sparsity_schedule]}"
            f" schedule laid over the run's {stored.steps} steps; resume with --steps "
            f"{stored.steps} (only fixed masks may run longer)"
        )


def _train_and_report(
    config: TrainConfig,
    folder: Path,
    *,
    resume: bool,
    progress: bool,
    score_test: bool,
    notes: list[str] | None,
) -> dict[str, Any]:
    started = time.perf_counter()
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu")
        if config.device == "auto"
        else config.device
    )
    seed_everything(config.seed)
    splits = load_splits(
        config.data, seed=config.seed, **split_options(config.data, config.max_length)
    )
    model = build_model(config, splits).to(device)
    groups = (
        [p for p in model.parameters() if p.requires_grad]
        if config.optimizer == "langevin"  # no weight decay: the regularizer is V's job
        else decay_groups(model, config.weight_decay)
    )
    optimizer = build_optimizer(config.optimizer, groups, **optimizer_options(config, splits))
    training_step: TrainingStep | None = (
        RegularizedStep(
            splits.task,
            VillaniRegularizer(
                model,
                config.villani_target,
                penalty=config.villani_penalty,  # type: ignore[arg-type]
                lam=config.villani_lam,
            ),
        )
        if config.villani_target is not None
        else None
    )
    if config.sparse:
        training_step = build_masked_step(
            config, model, optimizer, training_step or ErmStep(splits.task)
        )
    scheduler = warmup_schedule(
        optimizer,
        total_steps=config.steps,
        warmup_steps=round(config.warmup_fraction * config.steps),
        kind=config.schedule,
    )
    if distributed.is_main_process():
        folder.mkdir(parents=True, exist_ok=True)
        written = dataclasses.asdict(config)
        if resume:  # the run's own notes stay: they tell how it was started
            written[NOTES] = json.loads((folder / "config.json").read_text()).get(NOTES, [])
        elif notes:
            written[NOTES] = notes
        write_text_atomically(folder / "config.json", json.dumps(written, indent=2) + "\n")
    parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        "training %s (%.2f M parameters) on %s for %d steps",
        config.model,
        parameters / 1e6,
        config.data,
        config.steps,
    )
    stop = StopOnSignal()
    with stop:
        result = fit(
            model,
            optimizer,
            splits.train,
            max_steps=config.steps,
            batch_size=config.batch_size,
            task=splits.task,
            training_step=training_step,
            scheduler=scheduler,
            eval_data=splits.validation,
            eval_every=config.eval_every,
            grad_clip=config.grad_clip or None,
            precision=config.precision,
            seed=config.seed,
            run_dir=folder,
            checkpoint_every=config.checkpoint_every or config.steps,
            resume=resume,
            progress=progress,
            callbacks=[HorstStrengthLog(optimizer)] if isinstance(optimizer, HORST) else [],
            should_stop=stop,
        )
    if result.stopped:
        return {
            "interrupted": {
                "signal": stop.received,
                "step": result.step,
                "steps": config.steps,
                "checkpoint": str(result.checkpoint),
            }
        }
    summary = {
        "data": config.data,
        "model": config.model,
        "task": splits.task,
        "parameters": parameters,
        "steps": result.step,
        "train_loss": result.train_loss,
        "validation": result.evaluation,
        "warnings": result.warnings,
        "acting": result.acting,
        "seconds": round(time.perf_counter() - started, 1),
        "examples": {
            "train": len(splits.train),
            "validation": len(splits.validation),
            "test": len(splits.test),
        },
    }
    if score_test:
        summary["test"] = evaluate(model, splits.test, splits.task, precision=config.precision)
    if isinstance(training_step, MaskedStep):
        summary["sparsity"] = {
            "achieved": training_step.achieved_sparsity(model),
            "target": config.sparsity,
            "schedule": config.sparsity_schedule,
            "method": SPARSITY_SCHEDULES[config.sparsity_schedule],
            "compressions": training_step.compressions,
            "prunable_weights": len(training_step.names),
            "mask_spec": config.mask_spec.as_dict(),
        }
    if distributed.is_main_process():
        write_text_atomically(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
        plot_training_curves(
            read_metrics(folder),
            folder / "loss_curve.png",
            title=f"{config.model} on {config.data}",
        )
    return summary
