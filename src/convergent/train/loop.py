"""A small, explicit training loop that runs unchanged under ``torchrun``.

One optimizer step per global batch: ``training_step.loss`` -> backward (with a gradient
scaler for fp16) -> optional clipping -> ``optimizer.step()`` ->
``training_step.after_optimizer_step`` -> scheduler. Evaluation, metrics (JSON lines and
TensorBoard), a tqdm bar, atomic checkpoints and exact resume come with it.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from convergent.losses import SCORE_KEYS, summarize_scores, task_scores
from convergent.models import unwrap_model
from convergent.models.placement import BlockHost, forward_block_by_block
from convergent.optim import Langevin, describe_temperature
from convergent.train import distributed
from convergent.train.batches import iterate_batches, take, trim_padding
from convergent.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from convergent.train.checks import MethodChecks, log_failures
from convergent.train.metrics import MetricsLogger
from convergent.train.reproducibility import rng_state, set_rng_state
from convergent.train.steps import ErmStep, TrainingStep, split_batch

PRECISIONS = ("fp32", "bf16", "fp16")
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


def autocast_context(
    precision: str, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for ``"bf16"``/``"fp16"``, a null context for ``"fp32"``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision 'fp16' needs a CUDA device; use 'bf16' or 'fp32' on CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Dataset[Any],
    task: str,
    batch_size: int = 256,
    precision: str = "fp32",
) -> dict[str, float]:
    """Loss and task metrics over ``dataset``, split across processes and summed exactly."""
    device = distributed.model_device(model)
    was_training = model.training
    model.eval()
    size = len(dataset)  # type: ignore[arg-type]
    rank, world = distributed.rank(), distributed.world_size()
    totals: dict[str, torch.Tensor] = {}
    for start in range(rank * batch_size, size, batch_size * world):
        indices = torch.arange(start, min(start + batch_size, size))
        batch = {k: v.to(device) for k, v in trim_padding(take(dataset, indices)).items()}
        inputs, labels = split_batch(batch)
        with autocast_context(precision, device):
            logits = model(**inputs).logits
        for key, value in task_scores(logits, labels, task).items():
            totals[key] = totals.get(key, torch.zeros((), device=device)) + value.to(device)
    if not totals:  # this rank had no examples; it still takes part in the reductions
        totals = {key: torch.zeros((), device=device) for key in SCORE_KEYS[task]}
    totals = {key: distributed.all_reduce_sum(value) for key, value in totals.items()}
    model.train(was_training)
    return summarize_scores(totals, task)


def evaluate_block_by_block(
    model: nn.Module,
    prefix: str,
    dataset: Dataset[Any],
    task: str,
    batch_size: int,
    device: torch.device,
    host: BlockHost | None = None,
) -> dict[str, float]:
    """:func:`evaluate`'s metrics, computed one Transformer block at a time over every batch
    (:func:`~convergent.models.placement.forward_block_by_block`): for a model whose blocks
    live elsewhere (another device, or its files). One process.

    Args:
        model: the model (its blocks at ``prefix`` may be empty: ``host`` brings them).
        prefix: the name of its block list.
        dataset: the examples (with ``labels``).
        task: as for :func:`evaluate`.
        batch_size: examples per batch.
        device: where to compute.
        host: brings each block to ``device`` (None: it is in memory).
    """
    size = len(dataset)  # type: ignore[arg-type]
    batches = [
        trim_padding(take(dataset, torch.arange(start, min(start + batch_size, size))))
        for start in range(0, size, batch_size)
    ]
    inputs = [split_batch(batch)[0] for batch in batches]
    totals: dict[str, torch.Tensor] = {}
    outputs = forward_block_by_block(model, prefix, inputs, device, host)
    for batch, output in zip(batches, outputs, strict=True):
        for key, value in task_scores(output.logits, batch["labels"].to(device), task).items():
            totals[key] = totals.get(key, torch.zeros((), device=device)) + value
    return summarize_scores(totals, task)


def _state(
    step: int,
    optimizer: Optimizer,
    scheduler: Any,
    training_step: TrainingStep,
    scaler: Any,
    checks: MethodChecks | None,
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "format": "convergent-checkpoint-1",
        "step": step,
        "optimizer": optimizer.state_dict(),
        "training_step": training_step.state_dict(),
        "rng": rng_state(),
    }
    if checks is not None:
        state["checks"] = checks.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    return state


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or infinite; nothing of that step was applied."""


def holds_a_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds metrics or checkpoints of an earlier run."""
    folder = Path(run_dir)
    return (folder / "metrics.jsonl").is_file() or (folder / "checkpoints").is_dir()


def _call(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


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

    Raises:
        TrainingDiverged: the loss became NaN or infinite (a ``FloatingPointError``).
        callbacks: objects with any of ``on_step_end(step, metrics)``,
            ``on_evaluate(step, metrics)`` and ``on_fit_end(result)``.
        progress: show a tqdm bar (main process only).
        log_every: log training metrics every this many steps.
        tensorboard: also write TensorBoard scalars.
        checks: run the manipulation checks of :class:`~convergent.train.checks.MethodChecks`
            (is HORST's mirror step, Langevin's noise, a descent constraint, a sparsity
            target acting?): their readings join the train metrics of their steps
            (``mirror_move_ratio``, ``noise_displacement_ratio``), and each failed check once to the Python log, the metrics (``"split": "warning"``),
            TensorBoard and ``FitResult.warnings``.
        should_stop: asked before every step (under DDP, any rank's True stops every rank):
            True ends the run there, with a checkpoint of the last step taken (given a
            ``run_dir``), no final evaluation and ``FitResult.stopped`` set; ``convergent
            train`` asks whether SIGINT or SIGTERM arrived.
    """
    if max_steps < 0:
        raise ValueError(f"max_steps must be a non-negative integer, got {max_steps}")
    if grad_clip is not None and grad_clip <= 0:
        raise ValueError(f"grad_clip must be positive or None, got {grad_clip}")
    if checkpoint_every > 0 and run_dir is None:
        raise ValueError("checkpoint_every > 0 needs a run_dir to write checkpoints into")
    training_step = training_step or ErmStep(task)
    method_checks = (
        MethodChecks(optimizer, training_step, max_steps=max_steps)
        if checks and max_steps > 0
        else None
    )
    device = distributed.model_device(model)
    autocast_context(precision, device)  # validates early
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    start_step = 0
    checkpoints = Path(run_dir) / "checkpoints" if run_dir is not None else None
    if not resume and run_dir is not None and holds_a_run(run_dir):
        raise ValueError(
            f"run_dir {run_dir} already holds a run (metrics or checkpoints); pass resume=True "
            "to continue it, or choose an empty folder"
        )
    if resume and checkpoints is not None and (checkpoints / "latest").is_file():
        state = load_checkpoint(checkpoints, model, map_location=device)
        optimizer.load_state_dict(state["optimizer"])
        training_step.load_state_dict(state["training_step"])
        if scheduler is not None and "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        start_step = int(state["step"])
        if method_checks is not None and "checks" in state:
            method_checks.load_state_dict(state["checks"])

    wrapped = distributed.wrap_model(model)
    logger = MetricsLogger(
        run_dir, tensorboard=tensorboard, resume_step=start_step if resume else None
    )
    batches: Iterator[dict[str, torch.Tensor]] = iterate_batches(
        train_data,
        batch_size,
        seed=seed,
        start_step=start_step,
        rank=distributed.rank(),
        world_size=distributed.world_size(),
        device=device,
    )
    bar = tqdm(
        total=max_steps,
        initial=start_step,
        desc="train",
        disable=not (progress and distributed.is_main_process()),
        dynamic_ncols=True,
    )
    if isinstance(optimizer, Langevin) and distributed.is_main_process():
        log.info(_temperature_line(optimizer, train_data, task))
    result = FitResult(step=start_step, train_loss=math.nan, history=logger.records)
    if method_checks is not None:  # a resumed run keeps the warnings it wrote before
        result.warnings = [dict(record) for record in method_checks.warned.values()]

    def report(step: int, failed: list[Any]) -> None:
        log_failures(failed)
        for check in failed:
            logger.warn(step, check.as_record())
            result.warnings.append({"step": step, **check.as_record()})

    wrapped.train()
    checkpointed = start_step if resume and start_step > 0 else None  # loaded from there
    try:
        for step in range(start_step + 1, max_steps + 1):
            if should_stop is not None and distributed.any_rank(should_stop(), device):
                result.stopped = True
                break
            batch = next(batches)
            optimizer.zero_grad(set_to_none=True)
            with autocast_context(precision, device):
                loss, metrics = training_step.loss(wrapped, batch)
            if not torch.isfinite(loss.detach()):
                raise TrainingDiverged(
                    f"training diverged: the loss became {float(loss.detach())} at step {step}; "
                    "lower the learning rate (or clip gradients) and train again"
                    + (f" (the checkpoints in {checkpoints} are intact)" if checkpoints else "")
                )
            (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.unscale_(optimizer)
            if grad_clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                metrics["grad_norm"] = float(norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            metrics.update(training_step.after_optimizer_step(wrapped))
            readings: dict[str, float] = {}
            failed: list[Any] = []
            if method_checks is not None:  # before the scheduler: the lr this step used
                readings, failed = method_checks.after_step(step, metrics, wrapped)
                metrics.update(readings)
            if scheduler is not None:
                scheduler.step()
            metrics["lr"] = optimizer.param_groups[0]["lr"]
            result.step, result.train_loss = step, metrics.get("loss", float(loss.detach()))
            if step % log_every == 0 or step == max_steps or readings or failed:
                logger.log(step, "train", metrics)
            report(step, failed)
            bar.update(1)
            bar.set_postfix(loss=f"{result.train_loss:.4f}", refresh=False)
            _call(callbacks, "on_step_end", step, metrics)
            if (
                eval_data is not None
                and eval_every > 0
                and step % eval_every == 0
                and step < max_steps
            ):
                result.evaluation = evaluate(model, eval_data, task, precision=precision)
                logger.log(step, "validation", result.evaluation)
                _call(callbacks, "on_evaluate", step, result.evaluation)
            if checkpoints is not None and checkpoint_every > 0 and step % checkpoint_every == 0:
                result.checkpoint = _checkpoint(
                    checkpoints,
                    step,
                    model,
                    optimizer,
                    scheduler,
                    training_step,
                    scaler,
                    keep_checkpoints,
                    method_checks,
                )
                checkpointed = step
        if not result.stopped:
            if eval_data is not None:
                result.evaluation = evaluate(model, eval_data, task, precision=precision)
                logger.log(result.step, "validation", result.evaluation)
                _call(callbacks, "on_evaluate", result.step, result.evaluation)
            if method_checks is not None:
                report(result.step, method_checks.finish(result.step, wrapped))
                result.acting = list(method_checks.confirmed.values())
        # A stopped run always keeps its last step; a finished one as checkpoint_every asks.
        wanted = result.stopped or (checkpoint_every > 0 and result.step > 0)
        if checkpoints is not None and wanted and checkpointed != result.step:
            result.checkpoint = _checkpoint(
                checkpoints,
                result.step,
                model,
                optimizer,
                scheduler,
                training_step,
                scaler,
                keep_checkpoints,
                method_checks,
            )
        elif checkpoints is not None and result.stopped and result.checkpoint is None:
            result.checkpoint = resolve_checkpoint(checkpoints)  # stopped before any step
    finally:
        bar.close()
        logger.close()
    _call(callbacks, "on_fit_end", result)
    return result


def _temperature_line(optimizer: Langevin, train_data: Dataset[Any], task: str) -> str:
    """The run's largest s in loss units (N the training examples, K a label's numbers)."""
    examples = len(train_data)  # type: ignore[arg-type]
    outputs = 1
    if task == "regression" and examples:
        outputs = max(1, int(torch.as_tensor(train_data[0]["labels"]).numel()))
    s = max(float(group["s"]) for group in optimizer.param_groups)
    return describe_temperature(s, max(1, examples), outputs)


def _checkpoint(
    folder: Path,
    step: int,
    model: nn.Module,
    optimizer: Optimizer,
    scheduler: Any,
    training_step: TrainingStep,
    scaler: Any,
    keep: int,
    checks: MethodChecks | None,
) -> Path | None:
    """Rank 0 writes; the others wait so that no process runs ahead of a checkpoint."""
    path = None
    if distributed.is_main_process():
        state = _state(step, optimizer, scheduler, training_step, scaler, checks)
        path = save_checkpoint(folder, step, unwrap_model(model), state, keep=keep)
    if distributed.is_distributed():
        torch.distributed.barrier()
    return path
