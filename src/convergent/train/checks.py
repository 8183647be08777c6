"""Live manipulation checks: does each method of a run act, and if not, one warning that says so.

Each method declares its own check beside its code and registers it by type
(`convergent.acting.register_check`): HORST and HAM (`convergent.optim.mirror_check`),
Langevin (`convergent.optim.langevin_check`), masks (`convergent.sparse.sparsity_check`, for a
`MaskedStep`) and descent constraints (`convergent.constrained.descent_check`, for a
`PrimalDualStep`). :class:`MethodChecks` asks the registry for the checks of a run's optimizer
and training step and drives them, whatever they are: every step each may take note of the
step; every ``every`` steps each reads the run; at the first reading past a quarter of the run
and at its end each decides. Each failed check is reported once (`warnings`); `fit` writes it
to the Python log, ``metrics.jsonl`` (``"split": "warning"``), TensorBoard and its result, and
`MethodChecksCallback` to a Trainer's ``log_history``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn
from torch.optim import Optimizer

from convergent.acting import ActingCheck, MethodCheck, RunShape, checks_for

logger = logging.getLogger(__name__)

__all__ = ["READINGS_PER_RUN", "MethodChecks", "introductions", "log_failures"]

# Readings over a run, as the studies record (every 1/20 of a run).
READINGS_PER_RUN = 20
# Periodic checks decide first once this share of the run has passed.
DECIDE_AFTER = 0.25


class MethodChecks:
    """Measures whether a run's methods act and reports each failed check once.

    Args:
        optimizer: the run's optimizer; its registered checks are run (HORST, HAM and
            Langevin register theirs), an optimizer without any adds none.
        training_step: the run's training step; its registered checks are run (a
            `PrimalDualStep` adds the descent checks, a `MaskedStep` the sparsity checks and
            its base step's).
        max_steps: the run's length in optimizer steps.
        every: steps between readings; None reads `READINGS_PER_RUN` times per run.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        training_step: Any = None,
        *,
        max_steps: int,
        every: int | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.optimizer = optimizer
        self.max_steps = max_steps
        self.every = every or max(1, max_steps // READINGS_PER_RUN)
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.decide_at = max(self.every, math.ceil(DECIDE_AFTER * max_steps))
        run = RunShape(max_steps, self.every)
        self.checks: list[MethodCheck] = [
            *checks_for(optimizer, run),
            *checks_for(training_step, run),
        ]
        self.proofs = {name for check in self.checks for name in check.proofs}
        self.warned: dict[str, dict[str, Any]] = {}
        self.confirmed: dict[str, str] = {}  # each passed check's line, kept as it first passed
        self.losses: list[tuple[int, float]] = []

    def after_step(
        self, step: int, metrics: Mapping[str, float], model: nn.Module | None = None
    ) -> tuple[dict[str, float], list[ActingCheck]]:
        """Reads step ``step`` (just after its optimizer step, gradients still in place).

        Returns:
            The readings taken at this step (empty most steps), and the checks that failed
            for the first time.
        """
        if "loss" in metrics:
            self.losses.append((step, float(metrics["loss"])))
        failed = [
            found
            for check in self.checks
            for found in self._report(step, check.observe(step, metrics))
        ]
        readings: dict[str, float] = {}
        if step % self.every == 0:
            for check in self.checks:
                values, decided = check.read(step)
                readings.update(values)
                failed += self._report(step, decided)
            if step >= self.decide_at:
                failed += self._decide(step, final=False, model=model)
        return readings, failed

    def record_loss(self, step: int, loss: float) -> None:
        """A train loss of step ``step`` from elsewhere (a Trainer's logs)."""
        self.losses.append((step, float(loss)))

    def finish(self, step: int, model: nn.Module | None = None) -> list[ActingCheck]:
        """The end of the run: every check decides; returns those failing for the first time."""
        return self._decide(step, final=True, model=model)

    def _decide(self, step: int, final: bool, model: nn.Module | None) -> list[ActingCheck]:
        failed = []
        for check in self.checks:
            failed += self._report(step, check.decide(step, self.losses, final, model))
        return failed

    def _report(self, step: int, checks: list[ActingCheck]) -> list[ActingCheck]:
        failed = []
        for check in checks:
            key = f"{check.method}:{check.name}"
            if check.acted:
                if (
                    check.name in self.proofs
                    and key not in self.confirmed
                    and key not in self.warned
                ):
                    self.confirmed[key] = check.confirmation
                    logger.info(check.confirmation)
                continue
            if key in self.warned:
                continue
            self.warned[key] = {"step": step, **check.as_record()}
            failed.append(check)
        return failed

    # --- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to decide as the uninterrupted one (readings, counts, which
        checks have warned): one flat dict of the run's keys and each check's own."""
        state: dict[str, Any] = {
            "warned": dict(self.warned),
            "confirmed": dict(self.confirmed),
            "losses": [list(entry) for entry in self.losses],
        }
        for check in self.checks:
            state.update(check.state_dict())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.warned = dict(state["warned"])
        self.confirmed = dict(state.get("confirmed", {}))
        self.losses = [(int(step), float(loss)) for step, loss in state["losses"]]
        for check in self.checks:
            check.load_state_dict(state)


def introductions(methods: Sequence[object], train_data: Any, task: str) -> list[str]:
    """The lines stating each method's strength in the units of a run on ``train_data``
    (Langevin's temperature), for the run's start."""
    run = RunShape(max_steps=1, every=1)  # a check's introduction reads no run
    lines = [check.introduce(train_data, task) for m in methods for check in checks_for(m, run)]
    return [line for line in lines if line is not None]


def log_failures(failed: list[ActingCheck]) -> None:
    """Each failed check as one warning line in the Python log."""
    for check in failed:
        logger.warning(check.message)
