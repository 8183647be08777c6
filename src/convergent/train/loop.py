"""A small, explicit training loop that runs unchanged under ``torchrun``.

One optimizer step per global batch: ``training_step.loss`` -> backward (with a gradient
scaler for fp16) -> optional clipping -> ``optimizer.step()`` ->
``training_step.after_optimizer_step`` -> the manipulation checks -> scheduler. Evaluation,
metrics (JSON lines and TensorBoard), a tqdm bar, atomic checkpoints and exact resume come with
it: `fit` runs them as events (:mod:`convergent.train.fit_events`, one job each).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset

from convergent.train import distributed
from convergent.train.batches import iterate_batches
from convergent.train.checks import MethodChecks, introductions
from convergent.train.evaluation import (
    PRECISIONS,
    autocast_context,
    evaluate,
    evaluate_block_by_block,
)
from convergent.train.fit_events import (
    CheckEvents,
    Checkpoints,
    Evaluation,
    OptimizerStep,
    Progress,
    RunState,
    TrainingDiverged,
    call_hook,
    holds_a_run,
)
from convergent.train.metrics import MetricsLogger
from convergent.train.steps import ErmStep, TrainingStep

__all__ = [
    "PRECISIONS",
    "FitResult",
    "TrainingDiverged",
    "autocast_context",
    "evaluate",
    "evaluate_block_by_block",
    "fit",
    "holds_a_run",
]

log = logging.getLogger(__name__)


@dataclass
class FitResult:
    """What :func:`fit` leaves behind.

    ``warnings`` holds each failed manipulation check once (step, check, method, value,
    threshold, message); ``acting`` the line of each check that passed (``"HORST acts: ..."``).
    ``stopped`` is True when ``should_stop`` ended the run before ``max_steps`` (``step`` is
    the last step taken, ``checkpoint`` the checkpoint written there).
    """

    step: int
    train_loss: float
    evaluation: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: Path | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)
    acting: list[str] = field(default_factory=list)
    stopped: bool = False


def fit(
    model: nn.Module,
    optimizer: Optimizer,
    train_data: Dataset[Any],
    *,
    max_steps: int,
    batch_size: int,
    task: str = "classification",
    training_step: TrainingStep | None = None,
    scheduler: Any = None,
    eval_data: Dataset[Any] | None = None,
    eval_every: int = 0,
    grad_clip: float | None = None,
    precision: str = "fp32",
    seed: int = 0,
    run_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    keep_checkpoints: int = 2,
    resume: bool = False,
    callbacks: Sequence[Any] = (),
    progress: bool = True,
    log_every: int = 1,
    tensorboard: bool = True,
    checks: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> FitResult:
    """Train ``model`` for ``max_steps`` optimizer steps.

    Under ``torchrun`` (after :func:`distributed.init_from_environment`), the model is
    wrapped in DDP and each process takes ``batch_size / world_size`` examples of the same
    global batch; the result equals a single-process run with ``batch_size``.

    Args:
        model: a convergent model (its forward returns an object with ``logits``).
        optimizer: any torch optimizer over ``model``'s parameters.
        train_data: a map-style dataset of dict examples.
        max_steps: optimizer steps in total (counting steps done before a resume).
        batch_size: the global batch size.
        task: the task of the default :class:`ErmStep` and of evaluation.
        training_step: the objective; :class:`ErmStep` by default.
        scheduler: an LR scheduler stepped once per optimizer step.
        eval_data: evaluated every ``eval_every`` steps and at the end.
        eval_every: 0 evaluates only at the end.
        grad_clip: max global gradient norm, or None.
        precision: ``"fp32"``, ``"bf16"`` (autocast) or ``"fp16"`` (CUDA, with a scaler).
        seed: the data-order seed (seed the model's initialization separately).
        run_dir: where metrics, TensorBoard logs and checkpoints go; None keeps nothing.
        checkpoint_every: write a checkpoint every this many steps (and at the end) if > 0.
        keep_checkpoints: how many checkpoints to keep.
        resume: continue from the newest checkpoint in ``run_dir`` if there is one (from
            step 0 if there is none). Without it, a ``run_dir`` that already holds metrics or
            checkpoints is refused, so that two runs never mix in one folder.
        callbacks: objects with any of ``on_step_end(step, metrics)``,
            ``on_evaluate(step, metrics)`` and ``on_fit_end(result)``.
        progress: show a tqdm bar (main process only).
        log_every: log training metrics every this many steps.
        tensorboard: also write TensorBoard scalars.
        checks: run the manipulation checks of :class:`~convergent.train.checks.MethodChecks`
            (is HORST's mirror step, Langevin's noise, a descent constraint, a sparsity
            target acting?): their readings join the train metrics of their steps
            (``mirror_move_ratio``, ``noise_displacement_ratio``), and each failed check
            once to the Python log, the metrics (``"split": "warning"``), TensorBoard and
            ``FitResult.warnings``.
        should_stop: asked before every step (under DDP, any rank's True stops every rank):
            True ends the run there, with a checkpoint of the last step taken (given a
            ``run_dir``), no final evaluation and ``FitResult.stopped`` set; ``convergent
            train`` asks whether SIGINT or SIGTERM arrived.

    Raises:
        TrainingDiverged: the loss became NaN or infinite (a ``FloatingPointError``).
    """
    _check_arguments(max_steps, grad_clip, checkpoint_every, run_dir)
    training_step = training_step or ErmStep(task)
    device = distributed.model_device(model)
    autocast_context(precision, device)  # validates early
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    checking = checks and max_steps > 0
    method_checks = (
        MethodChecks(optimizer, training_step, max_steps=max_steps) if checking else None
    )
    run = RunState(model, optimizer, scheduler, training_step, scaler, method_checks)
    start_step = run.resume(run_dir, resume, device)
    wrapped = distributed.wrap_model(model)
    logger = MetricsLogger(
        run_dir, tensorboard=tensorboard, resume_step=start_step if resume else None
    )
    batches = iterate_batches(train_data, batch_size, seed=seed, start_step=start_step,
                              rank=distributed.rank(), world_size=distributed.world_size(),
                              device=device)  # fmt: skip
    result = FitResult(step=start_step, train_loss=math.nan, history=logger.records)
    folder = Path(run_dir) / "checkpoints" if run_dir is not None else None
    take_step = OptimizerStep(run, lambda: autocast_context(precision, device), grad_clip, folder)
    watch = CheckEvents(method_checks, logger, result)
    evaluation = Evaluation(model, eval_data, task, precision, eval_every, max_steps, logger,
                            callbacks, result)  # fmt: skip
    # a resumed run starts at the checkpoint it was loaded from
    saving = Checkpoints(
        folder, checkpoint_every, keep_checkpoints, run, start_step or None, result
    )
    bar = Progress(max_steps, start_step, progress, result)
    events = [bar, *callbacks, evaluation, saving]  # each sees every step, in this order
    _introduce((optimizer, training_step), train_data, task)
    wrapped.train()
    try:
        for step in range(start_step + 1, max_steps + 1):
            if should_stop is not None and distributed.any_rank(should_stop(), device):
                result.stopped = True
                break
            loss, metrics = take_step(wrapped, next(batches), step)
            noted, failed = watch.after_step(step, metrics, wrapped)
            if scheduler is not None:
                scheduler.step()
            metrics["lr"] = optimizer.param_groups[0]["lr"]
            result.step, result.train_loss = step, metrics.get("loss", float(loss.detach()))
            if step % log_every == 0 or step == max_steps or noted:
                logger.log(step, "train", metrics)
            watch.report(step, failed)
            call_hook(events, "on_step_end", step, metrics)
        if not result.stopped:
            evaluation.run(result.step)
            watch.finish(wrapped)
        saving.finish()
    finally:
        bar.close()
        logger.close()
    call_hook(callbacks, "on_fit_end", result)
    return result


def _check_arguments(
    max_steps: int, grad_clip: float | None, checkpoint_every: int, run_dir: str | Path | None
) -> None:
    if max_steps < 0:
        raise ValueError(f"max_steps must be a non-negative integer, got {max_steps}")
    if grad_clip is not None and grad_clip <= 0:
        raise ValueError(f"grad_clip must be positive or None, got {grad_clip}")
    if checkpoint_every > 0 and run_dir is None:
        raise ValueError("checkpoint_every > 0 needs a run_dir to write checkpoints into")


def _introduce(methods: Sequence[object], train_data: Dataset[Any], task: str) -> None:
    """Logs each method's strength in the run's units (Langevin's temperature), once."""
    if distributed.is_main_process():
        for line in introductions(methods, train_data, task):
            log.info(line)
