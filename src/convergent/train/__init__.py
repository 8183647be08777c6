"""The training loop, its steps, checkpoints, metrics and the distributed helpers."""

from . import distributed
from .batches import calibration_batches, iterate_batches
from .callbacks import HorstStrengthLog
from .checkpoint import (
    CheckpointError,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from .checks import MethodChecks
from .loop import FitResult, TrainingDiverged, evaluate, fit, holds_a_run
from .masked import MaskedStep
from .metrics import MetricsLogger, read_metrics
from .primal_dual import PrimalDualStep, dataset_layer_losses, descent_step
from .regularized import RegularizedStep
from .reproducibility import rng_state, seed_everything, set_rng_state
from .schedules import warmup_schedule
from .steps import ErmStep, TrainingStep, split_batch

__all__ = [
    "CheckpointError",
    "ErmStep",
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
