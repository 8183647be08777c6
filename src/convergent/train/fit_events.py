"""The parts of :func:`~convergent.train.fit`, one job each: resume, the optimizer step, the
manipulation checks, evaluation, checkpoints and progress.

`fit` runs them as events: a step is taken (`OptimizerStep`), the checks read it
(`CheckEvents`), then every object with an ``on_step_end(step, metrics)`` hook sees it, in
order: the progress bar, the user's callbacks, evaluation, checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from convergent.acting import ActingCheck
from convergent.models import unwrap_model
from convergent.train import distributed
from convergent.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from convergent.train.checks import MethodChecks, log_failures
from convergent.train.evaluation import evaluate
from convergent.train.metrics import MetricsLogger
from convergent.train.reproducibility import rng_state, set_rng_state
from convergent.train.steps import TrainingStep

__all__ = [
    "CheckEvents",
    "Checkpoints",
    "Evaluation",
    "OptimizerStep",
    "Progress",
    "RunState",
    "TrainingDiverged",
    "call_hook",
    "holds_a_run",
]


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or infinite; nothing of that step was applied."""


def holds_a_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds metrics or checkpoints of an earlier run."""
    folder = Path(run_dir)
    return (folder / "metrics.jsonl").is_file() or (folder / "checkpoints").is_dir()


def call_hook(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    """Calls ``hook(*args)`` on each callback that has it."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


@dataclass
class RunState:
    """Everything a checkpoint holds besides the model's weights, and resume.

    Attributes:
        model: the unwrapped model.
        optimizer, scheduler, training_step, scaler: the run's; scheduler and scaler may be
            None.
        checks: the run's manipulation checks, or None.
    """

    model: nn.Module
    optimizer: Optimizer
    scheduler: Any
    training_step: TrainingStep
    scaler: Any
    checks: MethodChecks | None

    def state_dict(self, step: int) -> dict[str, Any]:
        """The checkpoint's state at step ``step``."""
        state: dict[str, Any] = {
            "format": "convergent-checkpoint-1",
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "training_step": self.training_step.state_dict(),
            "rng": rng_state(),
        }
        if self.checks is not None:
            state["checks"] = self.checks.state_dict()
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def resume(self, run_dir: str | Path | None, resume: bool, device: torch.device) -> int:
        """The step to start from: the newest checkpoint's in ``run_dir`` when ``resume`` asks
        for it (its state loaded), else 0. A ``run_dir`` holding a run is refused without
        ``resume``, so that two runs never mix in one folder."""
        if not resume and run_dir is not None and holds_a_run(run_dir):
            raise ValueError(
                f"run_dir {run_dir} already holds a run (metrics or checkpoints); pass "
                "resume=True to continue it, or choose an empty folder"
            )
        checkpoints = Path(run_dir) / "checkpoints" if run_dir is not None else None
        if not (resume and checkpoints is not None and (checkpoints / "latest").is_file()):
            return 0
        state = load_checkpoint(checkpoints, self.model, map_location=device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.training_step.load_state_dict(state["training_step"])
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        if self.checks is not None and "checks" in state:
            self.checks.load_state_dict(state["checks"])
        return int(state["step"])


class OptimizerStep:
    """One optimizer step on one batch: ``training_step.loss`` -> backward (scaled for fp16) ->
    optional clipping -> ``optimizer.step()`` -> ``training_step.after_optimizer_step``.

    Args:
        run: the run's optimizer, training step and scaler.
        autocast: the precision's autocast context, made afresh for each step.
        grad_clip: max global gradient norm, or None.
        checkpoints: the run's checkpoint folder, named when the loss diverges.
    """

    def __init__(
        self,
        run: RunState,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
        grad_clip: float | None,
        checkpoints: Path | None,
    ) -> None:
        self.run = run
        self.autocast = autocast
        self.grad_clip = grad_clip
        self.checkpoints = checkpoints

    def __call__(
        self, wrapped: nn.Module, batch: dict[str, torch.Tensor], step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Takes step ``step``: (its loss, its training metrics).

        Raises:
            TrainingDiverged: the loss is NaN or infinite (nothing of the step is applied).
        """
        optimizer, scaler = self.run.optimizer, self.run.scaler
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss, metrics = self.run.training_step.loss(wrapped, batch)
        if not torch.isfinite(loss.detach()):
            raise TrainingDiverged(
                f"training diverged: the loss became {float(loss.detach())} at step {step}; "
                "lower the learning rate (or clip gradients) and train again"
                + (
                    f" (the checkpoints in {self.checkpoints} are intact)"
                    if self.checkpoints
                    else ""
                )
            )
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.unscale_(optimizer)
        if self.grad_clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.run.model.parameters(), self.grad_clip)
            metrics["grad_norm"] = float(norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        metrics.update(self.run.training_step.after_optimizer_step(wrapped))
        return loss, metrics


class CheckEvents:
    """The manipulation checks in a run: their readings join the step's metrics, and each
    failed check goes once to the Python log, the metrics and ``result.warnings``.

    Args:
        checks: the run's checks, or None (checks off).
        logger: the run's metrics.
        result: the run's result (a resumed run keeps the warnings it wrote before).
    """

    def __init__(self, checks: MethodChecks | None, logger: MetricsLogger, result: Any) -> None:
        self.checks = checks
        self.logger = logger
        self.result = result
        if checks is not None:
            result.warnings = [dict(record) for record in checks.warned.values()]

    def after_step(
        self, step: int, metrics: dict[str, float], model: nn.Module
    ) -> tuple[bool, list[ActingCheck]]:
        """Reads step ``step`` (before the scheduler: the lr this step used): whether there is
        something to log this step, and the checks that failed for the first time."""
        if self.checks is None:
            return False, []
        readings, failed = self.checks.after_step(step, metrics, model)
        metrics.update(readings)
        return bool(readings or failed), failed

    def report(self, step: int, failed: list[ActingCheck]) -> None:
        """Writes each failed check once."""
        log_failures(failed)
        for check in failed:
            self.logger.warn(step, check.as_record())
            self.result.warnings.append({"step": step, **check.as_record()})

    def finish(self, model: nn.Module) -> None:
        """The end of a run that was not stopped: every check decides."""
        if self.checks is not None:
            self.report(self.result.step, self.checks.finish(self.result.step, model))
            self.result.acting = list(self.checks.confirmed.values())


class Evaluation:
    """Evaluates every ``every`` steps (not at the last) and at the end of the run.

    Args:
        model: the model.
        data: the evaluation data, or None (no evaluation).
        task: as for :func:`~convergent.train.evaluate`.
        precision: as for :func:`~convergent.train.evaluate`.
        every: steps between evaluations; 0 evaluates only at the end.
        max_steps: the run's length.
        logger: the run's metrics.
        callbacks: the user's, given ``on_evaluate(step, metrics)``.
        result: the run's result (``evaluation`` holds the latest).
    """

    def __init__(
        self,
        model: nn.Module,
        data: Dataset[Any] | None,
        task: str,
        precision: str,
        every: int,
        max_steps: int,
        logger: MetricsLogger,
        callbacks: Sequence[Any],
        result: Any,
    ) -> None:
        self.model = model
        self.data = data
        self.task = task
        self.precision = precision
        self.every = every
        self.max_steps = max_steps
        self.logger = logger
        self.callbacks = callbacks
        self.result = result

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if self.every > 0 and step % self.every == 0 and step < self.max_steps:
            self.run(step)

    def run(self, step: int) -> None:
        """Evaluates now (if there is data), as of step ``step``."""
        if self.data is None:
            return
        self.result.evaluation = evaluate(
            self.model, self.data, self.task, precision=self.precision
        )
        self.logger.log(step, "validation", self.result.evaluation)
        call_hook(self.callbacks, "on_evaluate", step, self.result.evaluation)


class Checkpoints:
    """Writes a checkpoint every ``every`` steps, and at the end as asked: a stopped run always
    keeps its last step, a finished one as ``every`` asks.

    Args:
        folder: the run's checkpoint folder, or None (none written).
        every: steps between checkpoints (0: none but a stopped run's).
        keep: how many to keep.
        run: what a checkpoint holds.
        written: the step of the checkpoint the run was resumed from (None: a new run).
        result: the run's result (``checkpoint`` is the last written).
    """

    def __init__(
        self,
        folder: Path | None,
        every: int,
        keep: int,
        run: RunState,
        written: int | None,
        result: Any,
    ) -> None:
        self.folder = folder
        self.every = every
        self.keep = keep
        self.run = run
        self.written = written
        self.result = result

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if self.folder is not None and self.every > 0 and step % self.every == 0:
            self.write(step)

    def finish(self) -> None:
        """The end of the run (finished or stopped)."""
        result = self.result
        wanted = result.stopped or (self.every > 0 and result.step > 0)
        if self.folder is not None and wanted and self.written != result.step:
            self.write(result.step)
        elif self.folder is not None and result.stopped and result.checkpoint is None:
            result.checkpoint = resolve_checkpoint(self.folder)  # stopped before any step

    def write(self, step: int) -> None:
        """Rank 0 writes; the others wait so that no process runs ahead of a checkpoint."""
        assert self.folder is not None
        path = None
        if distributed.is_main_process():
            state = self.run.state_dict(step)
            path = save_checkpoint(
                self.folder, step, unwrap_model(self.run.model), state, keep=self.keep
            )
        if distributed.is_distributed():
            torch.distributed.barrier()
        self.result.checkpoint = path
        self.written = step


class Progress:
    """A tqdm bar over the run's steps (main process only), showing the train loss.

    Args:
        max_steps: the run's length.
        start_step: the step it starts after (a resumed run's).
        show: whether to show it.
        result: the run's result (``train_loss`` is shown).
    """

    def __init__(self, max_steps: int, start_step: int, show: bool, result: Any) -> None:
        self.result = result
        self.bar = tqdm(
            total=max_steps,
            initial=start_step,
            desc="train",
            disable=not (show and distributed.is_main_process()),
            dynamic_ncols=True,
        )

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.result.train_loss:.4f}", refresh=False)

    def close(self) -> None:
        self.bar.close()
