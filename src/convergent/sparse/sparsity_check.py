"""The acting check of sparse training (fixed masks, AC/DC, GMP): is the target reached?

At the end of every compressed phase and of the run, the share of zeros among the prunable
weights must lie within `SPARSITY_TOLERANCE` of the target. The masked training step itself
lives in `convergent.train.masked` (it registers this check for its type); the check reads it
through `MaskedTraining`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from torch import nn

from convergent.acting import ActingCheck
from convergent.sparse.acdc import ACDCSchedule
from convergent.sparse.gmp import GradualSchedule

__all__ = ["SPARSITY_TOLERANCE", "MaskedTraining", "SparsityCheck", "sparsity_reached"]

# AC/DC's global top-k lands within a percent of its target (the sparsity study's check).
SPARSITY_TOLERANCE = 0.01


def sparsity_reached(achieved: float, target: float, step: int, method: str) -> ActingCheck:
    """The prunable weights were as sparse as the target, within `SPARSITY_TOLERANCE`.

    Args:
        achieved: the share of zeros among the prunable weights.
        target: the sparsity asked for.
        step: when it was measured, named in the message.
        method: ``"AC/DC"``, ``"GMP"`` or ``"fixed masks"``, named in the message.
    """
    gap = abs(achieved - target)
    return ActingCheck(
        "sparsity",
        "sparsity_reached",
        achieved,
        target,
        not gap > SPARSITY_TOLERANCE,
        f"{method} reached {100 * achieved:.1f} % sparsity at step {step} against a target of "
        f"{100 * target:.1f} % (within {100 * SPARSITY_TOLERANCE:g} points counts)",
        "the target was not reached; check that the schedule's total_steps is the run's "
        "length and that the masks are applied after every optimizer step.",
    )


class MaskedTraining(Protocol):
    """What the check reads of a masked training step."""

    sparsity: float
    schedule: ACDCSchedule | GradualSchedule | None
    # (step, zeros among the prunable weights) at the end of each compressed phase
    phase_sparsities: list[tuple[int, float]]

    @property
    def ends_compressed(self) -> bool: ...

    def achieved_sparsity(self, model: nn.Module) -> float: ...


class SparsityCheck:
    """The acting check of a masked training step (a `convergent.acting.MethodCheck`).

    Args:
        masked: the run's masked step; a resumed one's earlier phases were checked by the
            run that reached them.
    """

    proofs = ("sparsity_reached",)

    def __init__(self, masked: MaskedTraining) -> None:
        self.masked = masked
        self.phases_read = len(masked.phase_sparsities)

    def method(self) -> str:
        """``"fixed masks"``, ``"GMP"`` or ``"AC/DC"``, as the warning names it."""
        if self.masked.schedule is None:
            return "fixed masks"
        return "GMP" if isinstance(self.masked.schedule, GradualSchedule) else "AC/DC"

    def introduce(self, train_data: Any, task: str) -> str | None:
        return None

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[ActingCheck]:
        """The compressed phases that ended since the last step."""
        new = self.masked.phase_sparsities[self.phases_read :]
        self.phases_read = len(self.masked.phase_sparsities)
        return [
            sparsity_reached(value, self.masked.sparsity, at, self.method()) for at, value in new
        ]

    def read(self, step: int) -> tuple[dict[str, float], list[ActingCheck]]:
        return {}, []

    def decide(
        self,
        step: int,
        losses: Sequence[tuple[int, float]],
        final: bool,
        model: nn.Module | None,
    ) -> list[ActingCheck]:
        if not final or model is None:
            return []
        checks = self.observe(step, {})
        if self.masked.ends_compressed:
            achieved = self.masked.achieved_sparsity(model)
            checks.append(sparsity_reached(achieved, self.masked.sparsity, step, self.method()))
        return checks

    def state_dict(self) -> dict[str, Any]:
        return {"phases_read": self.phases_read}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.phases_read = int(state["phases_read"])
