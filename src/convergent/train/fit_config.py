"""How :func:`~convergent.train.fit` runs: steps, batch, evaluation and checkpoint cadence,
precision, what it shows and writes. One frozen record, so each default lives in one place and
a run's settings can be built once, stored and passed around; ``fit`` still takes the same
options as keywords."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FitConfig:
    """The settings of one :func:`~convergent.train.fit` run.

    Attributes:
        max_steps: optimizer steps in total (counting steps done before a resume).
        batch_size: the global batch size (under ``torchrun`` each process takes
            ``batch_size / world_size`` examples of the same global batch).
        task: the task of the default :class:`~convergent.train.ErmStep` and of evaluation.
        eval_every: evaluate every this many steps; 0 evaluates only at the end.
        grad_clip: max global gradient norm, or None.
        precision: ``"fp32"``, ``"bf16"`` (autocast) or ``"fp16"`` (CUDA, with a scaler).
        seed: the data-order seed (seed the model's initialization separately).
        run_dir: where metrics, TensorBoard logs and checkpoints go; None keeps nothing.
        checkpoint_every: write a checkpoint every this many steps (and at the end) if > 0.
        keep_checkpoints: how many checkpoints to keep.
        resume: continue from the newest checkpoint in ``run_dir`` if there is one (from
            step 0 if there is none). Without it, a ``run_dir`` that already holds metrics or
            checkpoints is refused, so that two runs never mix in one folder.
        progress: show a tqdm bar (main process only).
        log_every: log training metrics every this many steps.
        tensorboard: also write TensorBoard scalars.
        checks: run the manipulation checks of :class:`~convergent.train.MethodChecks` (is
            HORST's mirror step, Langevin's noise, a descent constraint, a sparsity target
            acting?): their readings join the train metrics of their steps
            (``mirror_move_ratio``, ``noise_displacement_ratio``), and each failed check goes
            once to the Python log, the metrics (``"split": "warning"``), TensorBoard and
            ``FitResult.warnings``.
    """

    max_steps: int
    batch_size: int
    task: str = "classification"
    eval_every: int = 0
    grad_clip: float | None = None
    precision: str = "fp32"
    seed: int = 0
    run_dir: str | Path | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    resume: bool = False
    progress: bool = True
    log_every: int = 1
    tensorboard: bool = True
    checks: bool = True

    def __post_init__(self) -> None:
        if self.max_steps < 0:
            raise ValueError(f"max_steps must be a non-negative integer, got {self.max_steps}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be positive or None, got {self.grad_clip}")
        if self.checkpoint_every > 0 and self.run_dir is None:
            raise ValueError("checkpoint_every > 0 needs a run_dir to write checkpoints into")
