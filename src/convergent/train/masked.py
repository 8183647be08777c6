"""The masked training step: sparse training with fixed masks or the AC/DC schedule.

It wraps another :class:`~convergent.train.steps.TrainingStep` (the objective) and keeps the
model's pruned weights at zero: before a compressed phase it builds magnitude masks from the
current weights (straight to the target sparsity), and after every optimizer step of a
compressed phase it re-applies them, so that neither momentum, weight decay nor HORST's Adam
stage revives a pruned weight. At each flip between dense and compressed phases the
optimizer's moments are reset as asked (see :mod:`convergent.sparse.enforce`). Under
``torchrun`` the masks of rank 0 are broadcast, so every rank holds the same masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from convergent.acting import RunShape, checks_for, register_check
from convergent.models import unwrap_model
from convergent.sparse import (
    ACDCSchedule,
    GradualSchedule,
    Masks,
    MaskSpec,
    SparsityCheck,
    check_reset,
    magnitude_masks,
    reset_optimizer_state,
)
from convergent.sparse.masks import check_sparsity
from convergent.train.steps import ErmStep, TrainingStep


class MaskedStep:
    """Sparse training around ``base``: fixed masks, AC/DC, or gradual magnitude pruning.

    With a :class:`~convergent.sparse.GradualSchedule` (GMP) the model trains dense until the
    schedule's start; then, at each of its updates, the masks are rebuilt from the current
    weights at the schedule's sparsity (pruned weights are zero, so they stay pruned) and the
    new pruned entries' moments are reset as asked; between updates the masks are re-applied
    after every step, as in a compressed phase.

    Args:
        base: the objective (e.g. ``ErmStep(task)``).
        optimizer: the optimizer of the run (its moments are reset at phase flips).
        names: the prunable parameter names of the unwrapped model
            (``spec.select(model).names``).
        sparsity: the target sparsity of each compression, in [0, 1].
        schedule: an :class:`~convergent.sparse.ACDCSchedule`, a
            :class:`~convergent.sparse.GradualSchedule` (whose final sparsity must be
            ``sparsity``), or None: compressed from the first step to the last (one
            compression, at the start, unless ``masks`` are given).
        masks: masks to start from (e.g. rebuilt from a sparse checkpoint).
        spec: the masks' distribution and pattern (its selection fields are the caller's:
            ``names = spec.select(model).names``); None is ``MaskSpec()``.
        input_dims: name -> a layer's input dimension, for N:M
            (``spec.select(model).input_dims``).
        reset: optimizer state reset at flips: ``"none"``, ``"momentum"`` or ``"moments"``.
        reset_how: ``"mask"`` (zero the pruned entries) or ``"zero"`` (the whole moment).
    """

    def __init__(
        self,
        base: TrainingStep | None,
        optimizer: Optimizer,
        names: list[str],
        *,
        sparsity: float,
        schedule: ACDCSchedule | GradualSchedule | None = None,
        masks: Masks | None = None,
        spec: MaskSpec | None = None,
        input_dims: Mapping[str, int] | None = None,
        reset: str = "momentum",
        reset_how: str = "mask",
    ) -> None:
        check_sparsity(sparsity)
        check_reset(reset, reset_how)
        if not names:
            raise ValueError("names is empty: there is nothing to prune")
        if isinstance(schedule, GradualSchedule) and schedule.final_sparsity != sparsity:
            raise ValueError(
                f"the GradualSchedule ends at {schedule.final_sparsity}, but sparsity is "
                f"{sparsity}; they must be equal"
            )
        self.base: TrainingStep = base if base is not None else ErmStep("classification")
        self.optimizer = optimizer
        self.names = list(names)
        self.sparsity = sparsity
        self.schedule = schedule
        self.masks = masks
        self.spec = MaskSpec.given(spec)
        self.input_dims = dict(input_dims or {})
        self.reset = reset
        self.reset_how = reset_how
        self.step = 0
        self.compressions = 0
        self._started = False
        self._sparsity = 0.0
        # (step, zeros among the prunable weights) at the end of each compressed phase: what
        # the run really reached, for the manipulation check (`SparsityCheck`).
        self.phase_sparsities: list[tuple[int, float]] = []

    @property
    def ends_compressed(self) -> bool:
        """Whether the schedule's last step is compressed (AC/DC's final phase, fixed masks,
        GMP)."""
        if self.schedule is None or isinstance(self.schedule, GradualSchedule):
            return True
        return self.schedule.is_compressed(self.schedule.total_steps - 1)

    def achieved_sparsity(self, model: nn.Module) -> float:
        """The share of zeros among the prunable weights of ``model`` now."""
        return Masks.from_weights(unwrap_model(model), self.names).sparsity()

    def _wants_compressed(self, step_index: int) -> bool:
        if self.schedule is None:
            return True
        if isinstance(self.schedule, GradualSchedule):
            return step_index >= self.schedule.start_step
        return self.schedule.is_compressed(step_index)

    def _target(self) -> float:
        """The sparsity of a compression before step ``self.step``."""
        if isinstance(self.schedule, GradualSchedule):
            return self.schedule.sparsity_at(self.step)
        return self.sparsity

    def _compress(self, model: nn.Module) -> None:
        if self.masks is None:
            self.masks = magnitude_masks(
                model,
                self.names,
                self._target(),
                self.spec,
                self.input_dims,
            )
            self.masks.broadcast(0)
            self.compressions += 1
        self._sparsity = self.masks.sparsity()
        self.masks.apply(model)
        reset_optimizer_state(self.optimizer, model, self.masks, self.reset, self.reset_how)

    def _decompress(self, model: nn.Module) -> None:
        assert self.masks is not None
        reset_optimizer_state(self.optimizer, model, self.masks, self.reset, self.reset_how)
        self.masks = None

    def _enter_phase(self, model: nn.Module) -> None:
        """Compress or decompress so that the model fits the phase of the next step."""
        inner = unwrap_model(model)
        if self._wants_compressed(self.step):
            self._compress(inner)
        elif self.masks is not None:
            self._decompress(inner)

    def _phase_changes_at(self, step_index: int) -> bool:
        return self._wants_compressed(step_index) != (self.masks is not None)

    def start(self, model: nn.Module) -> None:
        """Enter the first phase (compress now if it is compressed; given masks are applied
        here). Called by the first :meth:`loss`; a no-op once training has started or after
        :meth:`load_state_dict`."""
        if self.step == 0 and not self._started:
            self._enter_phase(model)
        self._started = True

    def loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        self.start(model)
        return self.base.loss(model, batch)

    def after_optimizer_step(self, model: nn.Module) -> dict[str, float]:
        metrics = dict(self.base.after_optimizer_step(model))
        inner = unwrap_model(model)
        if self.masks is not None:
            self.masks.apply(inner)
        self.step += 1
        if self._phase_changes_at(self.step):
            if self.masks is not None:  # a compressed phase ends: record what it reached
                self.phase_sparsities.append((self.step, self.achieved_sparsity(inner)))
            self._enter_phase(model)
        elif isinstance(self.schedule, GradualSchedule) and self.schedule.is_update(self.step):
            self.masks = None  # GMP: new masks at the schedule's sparsity, from the weights
            self._compress(inner)
        metrics["sparsity"] = self._sparsity if self.masks is not None else 0.0
        metrics["compressed"] = float(self.masks is not None)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "compressions": self.compressions,
            "masks": self.masks.state_dict() if self.masks is not None else {},
            "compressed": self.masks is not None,
            "phase_sparsities": [list(entry) for entry in self.phase_sparsities],
            "base": self.base.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self._started = True
        self.compressions = int(state.get("compressions", 0))
        self.masks = Masks.from_state_dict(state["masks"]) if state["compressed"] else None
        self._sparsity = self.masks.sparsity() if self.masks is not None else 0.0
        self.phase_sparsities = [
            (int(step), float(value)) for step, value in state.get("phase_sparsities", [])
        ]
        self.base.load_state_dict(state.get("base", {}))


def _masked_checks(masked: MaskedStep, run: RunShape) -> list[Any]:
    # the base step's checks first: a run reports the objective's before the masks'
    return [*checks_for(masked.base, run), SparsityCheck(masked)]


register_check(MaskedStep, _masked_checks)
