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
from dataclasses import dataclass, field, fields
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
from convergent.train.fit_config import FitConfig
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
    "FitConfig",
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
    config: FitConfig | None = None,
    *,
    training_step: TrainingStep | None = None,
    scheduler: Any = None,
    eval_data: Dataset[Any] | None = None,
    callbacks: Sequence[Any] = (),
    should_stop: Callable[[], bool] | None = None,
    **settings: Any,
) -> FitResult:
    """Train ``model`` for ``config.max_steps`` optimizer steps.

    Under ``torchrun`` the model is wrapped in DDP; the result equals one process's run.

    Args:
        model: a convergent model (its forward returns an object with ``logits``).
        optimizer: any torch optimizer over ``model``'s parameters.
        train_data: a map-style dataset of dict examples.
        config: the run's settings (`FitConfig`); or give its fields as keywords
            (``fit(model, optimizer, data, max_steps=100, batch_size=32)``).
        training_step: the objective; :class:`ErmStep` of ``config.task`` by default.
        scheduler: an LR scheduler stepped once per optimizer step.
        eval_data: evaluated every ``config.eval_every`` steps and at the end.
        callbacks: objects with any of ``on_step_end(step, metrics)``,
            ``on_evaluate(step, metrics)`` and ``on_fit_end(result)``.
        should_stop: asked before every step (under DDP, any rank's True stops every rank):
            True ends the run there, with a checkpoint of the last step taken (given a
            ``run_dir``), no final evaluation and ``FitResult.stopped`` set.

    Raises:
        TrainingDiverged: the loss became NaN or infinite (a ``FloatingPointError``).
    """
    c = _config(config, settings)
    training_step = training_step or ErmStep(c.task)
    device = distributed.model_device(model)
    run = _run_state(model, optimizer, scheduler, training_step, c, device)
    start_step = run.resume(c.run_dir, c.resume, device)
    wrapped = distributed.wrap_model(model)
    logger = MetricsLogger(c.run_dir, tensorboard=c.tensorboard,
                           resume_step=start_step if c.resume else None)  # fmt: skip
    batches = iterate_batches(train_data, c.batch_size, seed=c.seed, start_step=start_step,
                              rank=distributed.rank(), world_size=distributed.world_size(),
                              device=device)  # fmt: skip
    result = FitResult(step=start_step, train_loss=math.nan, history=logger.records)
    folder = Path(c.run_dir) / "checkpoints" if c.run_dir is not None else None
    take_step = OptimizerStep(
        run, lambda: autocast_context(c.precision, device), c.grad_clip, folder
    )
    watch = CheckEvents(run.checks, logger, result)
    evaluation = Evaluation(model, eval_data, c.task, c.precision, c.eval_every, c.max_steps,
                            logger, callbacks, result)  # fmt: skip
    # a resumed run starts at the checkpoint it was loaded from
    saving = Checkpoints(folder, c.checkpoint_every, c.keep_checkpoints, run, start_step or None,
                         result)  # fmt: skip
    bar = Progress(c.max_steps, start_step, c.progress, result)
    events = [bar, *callbacks, evaluation, saving]  # each sees every step, in this order
    _introduce((optimizer, training_step), train_data, c.task)
    wrapped.train()
    try:
        for step in range(start_step + 1, c.max_steps + 1):
            if should_stop is not None and distributed.any_rank(should_stop(), device):
                result.stopped = True
                break
            loss, metrics = take_step(wrapped, next(batches), step)
            noted, failed = watch.after_step(step, metrics, wrapped)
            if scheduler is not None:
                scheduler.step()
            metrics["lr"] = optimizer.param_groups[0]["lr"]
            result.step, result.train_loss = step, metrics.get("loss", float(loss.detach()))
            if step % c.log_every == 0 or step == c.max_steps or noted:
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


def _run_state(
    model: nn.Module,
    optimizer: Optimizer,
    scheduler: Any,
    training_step: TrainingStep,
    config: FitConfig,
    device: torch.device,
) -> RunState:
    """What a checkpoint holds besides the weights: the gradient scaler for fp16 and the
    methods' manipulation checks (when asked for) join the optimizer, scheduler and step."""
    autocast_context(config.precision, device)  # validates early
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    checking = config.checks and config.max_steps > 0
    checks = (
        MethodChecks(optimizer, training_step, max_steps=config.max_steps) if checking else None
    )
    return RunState(model, optimizer, scheduler, training_step, scaler, checks)


def _config(config: FitConfig | None, settings: dict[str, Any]) -> FitConfig:
    """``config``, or the `FitConfig` of the keywords given (one or the other)."""
    if config is not None and settings:
        raise TypeError(
            f"fit() takes a FitConfig or its fields as keywords, not both: got {sorted(settings)}"
        )
    if config is not None:
        return config
    unknown = sorted(set(settings) - {f.name for f in fields(FitConfig)})
    if unknown:
        raise TypeError(f"fit() got unexpected keyword argument(s) {unknown}")
    return FitConfig(**settings)


def _introduce(methods: Sequence[object], train_data: Dataset[Any], task: str) -> None:
    """Logs each method's strength in the run's units (Langevin's temperature), once."""
    if distributed.is_main_process():
        for line in introductions(methods, train_data, task):
            log.info(line)
