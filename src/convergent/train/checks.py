"""Live manipulation checks: does each method of a run act, and if not, one warning that says so.

:class:`MethodChecks` reads a run every so often and applies the checks of
`convergent.diagnostics.acting` (the thresholds the studies use too):

- HORST / HAM: the mirror/base move ratio (`horst_move_ratio`, `ham_move_ratio`) every
  ``every`` steps, its mean over the readings; HAM's weights stay finite;
- Langevin: over a window of `WINDOW_STEPS` steps before each reading, the noise's
  cumulative displacement (sqrt(sum lr s sum G), its expected norm) against the gradient
  steps' (||sum lr G grad||); the train loss against its first stretch (fit kept);
- descent constraints (a `PrimalDualStep`): lambda and slack read from every step's metrics;
  whether they bind, are met after warm-up, and have settled by the end;
- AC/DC and fixed masks (a `MaskedStep`): zeros among the prunable weights at the end of every
  compressed phase and of the run, against the target.

Periodic checks decide at the first reading past a quarter of the run and at its end; the
descent checks at the end. Each failed check is reported once (`warnings`); `fit` writes it to
the Python log, ``metrics.jsonl`` (``"split": "warning"``), TensorBoard and its result, and
`MethodChecksCallback` to a Trainer's ``log_history``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from convergent.diagnostics import acting
from convergent.optim import HAM, HORST, Langevin, _sharding, ham_move_ratio, horst_move_ratio
from convergent.sparse import GradualSchedule
from convergent.train.masked import MaskedStep
from convergent.train.primal_dual import PrimalDualStep

logger = logging.getLogger(__name__)

__all__ = ["READINGS_PER_RUN", "WINDOW_STEPS", "MethodChecks"]

# Readings over a run, as the studies record (every 1/20 of a run).
READINGS_PER_RUN = 20
# The Langevin window: long enough for a drift to add up, short next to a run.
WINDOW_STEPS = 20
# The checks whose pass shows that a method acted (the others only warn: a constraint that
# never binds is trivially met and settled).
PROOF = ("mirror_acts", "noise_acts", "constraints_bind", "sparsity_reached")
# Periodic checks decide first once this share of the run has passed.
DECIDE_AFTER = 0.25


class MethodChecks:
    """Measures whether a run's methods act and reports each failed check once.

    Args:
        optimizer: the run's optimizer; HORST, HAM (around AdamW or HORST) and Langevin are
            read, any other adds no check.
        training_step: the run's training step; a `PrimalDualStep` adds the descent checks, a
            `MaskedStep` the sparsity checks (its base step is looked into too).
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
        self.masked = training_step if isinstance(training_step, MaskedStep) else None
        inner = self.masked.base if self.masked is not None else training_step
        self.descent = inner if isinstance(inner, PrimalDualStep) else None
        self.warned: dict[str, dict[str, Any]] = {}
        self.confirmed: dict[str, str] = {}  # each passed check's line, kept as it first passed
        self.ratios: list[float] = []  # HORST / HAM readings
        self.windows: list[tuple[float, float]] = []  # Langevin (noise^2, gradient^2) per window
        self.losses: list[tuple[int, float]] = []
        # a resumed MaskedStep's earlier phases were checked by the run that reached them
        self.phases_read = len(self.masked.phase_sparsities) if self.masked is not None else 0
        self.largest_exponent = 0.0
        # descent: steps seen, steps with some lambda > 0, largest lambda, steps after
        # warm-up and those with every constraint met, largest lambda at 4/5 of the run
        self.descent_counts = {"steps": 0, "active": 0, "late": 0, "met": 0}
        self.largest_multiplier = 0.0
        self.multiplier_at_four_fifths: float | None = None
        self.multiplier_now = 0.0
        self._drift: dict[int, Tensor] = {}
        self._noise_squared = 0.0

    # --- what the run is ------------------------------------------------------------------

    @property
    def mirror_method(self) -> str | None:
        """``"HORST"`` or ``"HAM"`` when the optimizer has a mirror step to check."""
        if isinstance(self.optimizer, HAM):
            return "HAM"
        return "HORST" if isinstance(self.optimizer, HORST) else None

    def _mirror_setting(self) -> str:
        group = self.optimizer.param_groups[0]
        if isinstance(self.optimizer, HAM):
            return f"alpha {float(group['ham_alpha']):g}"
        if group.get("strength") is not None:
            return f"strength {float(group['strength']):g}"
        return f"alpha {float(group['alpha'] or 0.0):g}"

    def _langevin_s(self) -> float:
        return max(float(group["s"]) for group in self.optimizer.param_groups)

    # --- per step ---------------------------------------------------------------------------

    def after_step(
        self, step: int, metrics: Mapping[str, float], model: nn.Module | None = None
    ) -> tuple[dict[str, float], list[acting.ActingCheck]]:
        """Reads step ``step`` (just after its optimizer step, gradients still in place).

        Returns:
            The readings taken at this step (empty most steps), and the checks that failed
            for the first time.
        """
        readings: dict[str, float] = {}
        failed: list[acting.ActingCheck] = []
        if "loss" in metrics:
            self.losses.append((step, float(metrics["loss"])))
        if self.descent is not None:
            self._read_multipliers(step, metrics)
        if isinstance(self.optimizer, Langevin):
            self._accumulate_window(step)
        if self.masked is not None:
            failed += self._new_phase_checks(step)
        if step % self.every == 0:
            readings = self._read(step)
            if isinstance(self.optimizer, HAM):
                failed += self._report(step, [self._ham_finite()])
            if step >= self.decide_at:
                failed += self._report(step, self._periodic_checks(final=False))
        return readings, failed

    def record_loss(self, step: int, loss: float) -> None:
        """A train loss of step ``step`` from elsewhere (a Trainer's logs)."""
        self.losses.append((step, float(loss)))

    def finish(self, step: int, model: nn.Module | None = None) -> list[acting.ActingCheck]:
        """The end of the run: every check decides; returns those failing for the first time."""
        checks = self._periodic_checks(final=True)
        if self.descent is not None and self.descent_counts["steps"]:
            counts = self.descent_counts
            checks.append(
                acting.constraints_bind(self.largest_multiplier, counts["active"] / counts["steps"])
            )
            if counts["late"]:
                checks.append(
                    acting.constraints_met(counts["met"] / counts["late"], counts["late"])
                )
            if self.multiplier_at_four_fifths is not None:
                checks.append(
                    acting.multipliers_settled(self.multiplier_at_four_fifths, self.multiplier_now)
                )
        failed = self._report(step, checks)
        if self.masked is not None and model is not None:
            failed += self._new_phase_checks(step)
            if self.masked.ends_compressed:
                failed += self._report(
                    step,
                    [
                        acting.sparsity_reached(
                            self.masked.achieved_sparsity(model),
                            self.masked.sparsity,
                            step,
                            self._sparsity_method(),
                        )
                    ],
                )
        return failed

    # --- the checks -------------------------------------------------------------------------

    def _periodic_checks(self, final: bool) -> list[acting.ActingCheck]:
        checks = []
        method = self.mirror_method
        if method is not None and self.ratios:
            checks.append(acting.mirror_acts(method, self.ratios, self._mirror_setting()))
        if isinstance(self.optimizer, Langevin):
            s = self._langevin_s()
            # The noise check decides at the end, on the windows of the run's second half:
            # while the loss still falls, the gradient's drift outruns any useful noise.
            late = self.windows[len(self.windows) // 2 :]
            if final and late:
                noise = math.sqrt(sum(noise for noise, _ in late))
                gradient = math.sqrt(sum(gradient for _, gradient in late))
                checks.append(acting.noise_acts(noise, gradient, s))
            stretch = max(1, self.every)
            if len(self.losses) >= 2 * stretch:
                start = sum(loss for _, loss in self.losses[:stretch]) / stretch
                latest = sum(loss for _, loss in self.losses[-stretch:]) / stretch
                checks.append(acting.fit_kept(start, latest, s))
        return checks

    def _report(self, step: int, checks: list[acting.ActingCheck]) -> list[acting.ActingCheck]:
        failed = []
        for check in checks:
            key = f"{check.method}:{check.name}"
            if check.acted:
                if check.name in PROOF and key not in self.confirmed and key not in self.warned:
                    self.confirmed[key] = check.confirmation
                    logger.info(check.confirmation)
                continue
            if key in self.warned:
                continue
            self.warned[key] = {"step": step, **check.as_record()}
            failed.append(check)
        return failed

    def _read(self, step: int) -> dict[str, float]:
        readings: dict[str, float] = {}
        if isinstance(self.optimizer, HAM):
            ratio = ham_move_ratio(self.optimizer)
        elif isinstance(self.optimizer, HORST):
            ratio = horst_move_ratio(self.optimizer)
        else:
            ratio = math.nan
        if self.mirror_method is not None:
            readings["mirror_move_ratio"] = ratio
            if math.isfinite(ratio):
                self.ratios.append(ratio)
        if isinstance(self.optimizer, Langevin) and self.windows:
            noise, gradient = self.windows[-1]
            readings["noise_displacement_ratio"] = (
                math.sqrt(noise / gradient) if gradient > 0 else math.inf
            )
        return readings

    def _ham_finite(self) -> acting.ActingCheck:
        nonfinite = 0
        for group in self.optimizer.param_groups:
            alpha, lr = float(group["ham_alpha"]), float(group["lr"])
            for param in group["params"]:
                mirrored = param.ndim >= 2 if group["ham_mirror"] is None else group["ham_mirror"]
                if not mirrored:
                    continue
                local = _sharding.local(param.detach())
                if not bool(torch.isfinite(local).all()):
                    nonfinite += 1
                if param.grad is not None and param.grad.numel():
                    grad = _sharding.local(param.grad)
                    largest = float(grad.detach().abs().max())
                    self.largest_exponent = max(self.largest_exponent, lr * alpha * largest)
        return acting.ham_finite(nonfinite, self.largest_exponent)

    def _accumulate_window(self, step: int) -> None:
        """Adds step ``step``'s gradient move and noise variance to the window of the last
        `WINDOW_STEPS` steps before each reading; the reading's step closes it."""
        window = min(WINDOW_STEPS, self.every)
        if (step - 1) % self.every == self.every - window:  # the window's first step
            self._drift, self._noise_squared = {}, 0.0
        elif not (step % self.every == 0 or step % self.every > self.every - window):
            return
        for group in self.optimizer.param_groups:
            lr, s, eps = float(group["lr"]), float(group["s"]), float(group["eps"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = _sharding.local(param.grad).detach().double()
                state = self.optimizer.state.get(param, {})
                if group["preconditioned"] and "square_avg" in state:
                    # G = 1 / D with the denominator the step just used (v after its update)
                    inverse = 1.0 / (_sharding.local(state["square_avg"]).double().sqrt() + eps)
                    move = lr * inverse * grad
                    self._noise_squared += lr * s * float(inverse.sum())
                else:
                    move = lr * grad
                    self._noise_squared += lr * s * grad.numel()
                key = id(param)
                self._drift[key] = self._drift[key] + move if key in self._drift else move
        if step % self.every == 0:
            gradient = sum(float(move.square().sum()) for move in self._drift.values())
            self.windows.append((self._noise_squared, gradient))
            self._drift, self._noise_squared = {}, 0.0

    def _read_multipliers(self, step: int, metrics: Mapping[str, float]) -> None:
        layers = range(1, self.descent.num_layers + 1) if self.descent is not None else range(0)
        multipliers = [float(metrics[f"lambda_{i}"]) for i in layers if f"lambda_{i}" in metrics]
        if not multipliers:
            return
        counts = self.descent_counts
        counts["steps"] += 1
        self.multiplier_now = max(multipliers)
        self.largest_multiplier = max(self.largest_multiplier, self.multiplier_now)
        counts["active"] += int(self.multiplier_now > 0)
        if step >= math.ceil(0.8 * self.max_steps) and self.multiplier_at_four_fifths is None:
            self.multiplier_at_four_fifths = self.multiplier_now
        if step > acting.WARMUP_FRACTION * self.max_steps and all(
            f"slack_{i}" in metrics for i in layers
        ):
            counts["late"] += 1
            counts["met"] += int(
                all(
                    float(metrics[f"slack_{i}"]) <= float(metrics.get(f"u_{i}", 0.0))
                    for i in layers
                )
            )

    def _sparsity_method(self) -> str:
        assert self.masked is not None
        if self.masked.schedule is None:
            return "fixed masks"
        return "GMP" if isinstance(self.masked.schedule, GradualSchedule) else "AC/DC"

    def _new_phase_checks(self, step: int) -> list[acting.ActingCheck]:
        assert self.masked is not None
        new = self.masked.phase_sparsities[self.phases_read :]
        self.phases_read = len(self.masked.phase_sparsities)
        return self._report(
            step,
            [
                acting.sparsity_reached(value, self.masked.sparsity, at, self._sparsity_method())
                for at, value in new
            ],
        )

    # --- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to decide as the uninterrupted one (readings, counts, which
        checks have warned); the open Langevin window is not kept (it restarts)."""
        return {
            "warned": dict(self.warned),
            "confirmed": dict(self.confirmed),
            "ratios": list(self.ratios),
            "windows": [list(window) for window in self.windows],
            "losses": [list(entry) for entry in self.losses],
            "phases_read": self.phases_read,
            "largest_exponent": self.largest_exponent,
            "descent_counts": dict(self.descent_counts),
            "largest_multiplier": self.largest_multiplier,
            "multiplier_at_four_fifths": self.multiplier_at_four_fifths,
            "multiplier_now": self.multiplier_now,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.warned = dict(state["warned"])
        self.confirmed = dict(state.get("confirmed", {}))
        self.ratios = [float(value) for value in state["ratios"]]
        self.windows = [(float(a), float(b)) for a, b in state["windows"]]
        self.losses = [(int(step), float(loss)) for step, loss in state["losses"]]
        self.phases_read = int(state["phases_read"])
        self.largest_exponent = float(state["largest_exponent"])
        self.descent_counts = {key: int(value) for key, value in state["descent_counts"].items()}
        self.largest_multiplier = float(state["largest_multiplier"])
        four_fifths = state["multiplier_at_four_fifths"]
        self.multiplier_at_four_fifths = None if four_fifths is None else float(four_fifths)
        self.multiplier_now = float(state["multiplier_now"])


def log_failures(failed: list[acting.ActingCheck]) -> None:
    """Each failed check as one warning line in the Python log."""
    for check in failed:
        logger.warning(check.message)
