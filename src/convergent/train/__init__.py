"""The training loop, its steps, checkpoints, metrics and the distributed helpers."""

from convergent.train import distributed
from convergent.train.batches import calibration_batches, iterate_batches
from convergent.train.callbacks import HorstStrengthLog
from convergent.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from convergent.train.checks import MethodChecks
from convergent.train.loop import (
    FitConfig,
    FitResult,
    TrainingDiverged,
    evaluate,
    evaluate_block_by_block,
    fit,
    holds_a_run,
)
from convergent.train.masked import MaskedStep
from convergent.train.metrics import MetricsLogger, read_metrics
from convergent.train.primal_dual import PrimalDualStep, dataset_layer_losses, descent_step
from convergent.train.regularized import RegularizedStep
from convergent.train.reproducibility import rng_state, seed_everything, set_rng_state
from convergent.train.schedules import warmup_schedule
from convergent.train.steps import ErmStep, TrainingStep, split_batch

__all__ = [
    "CheckpointError",
    "ErmStep",
    "FitConfig",
    "FitResult",
    "HorstStrengthLog",
    "MaskedStep",
    "MethodChecks",
    "MetricsLogger",
    "PrimalDualStep",
    "RegularizedStep",
    "TrainingDiverged",
    "TrainingStep",
    "calibration_batches",
    "dataset_layer_losses",
    "descent_step",
    "distributed",
    "evaluate",
    "evaluate_block_by_block",
    "fit",
    "holds_a_run",
    "iterate_batches",
    "load_checkpoint",
    "read_metrics",
    "resolve_checkpoint",
    "rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
    "split_batch",
    "verify_checkpoint",
    "warmup_schedule",
]
