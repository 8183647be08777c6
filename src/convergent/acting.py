"""Whether a method acts: the check each method declares, its verdict, and the registry.

Each method of this library acts only at a strength tied to the user's scale, and a run that
sits below it looks like any other run. So each method declares its own acting check beside
its code (`convergent.optim.mirror_check` for HORST and HAM, `convergent.optim.langevin_check`,
`convergent.sparse.sparsity_check`, `convergent.constrained.descent_check`) and registers it by
the method's type with `register_check`. A training loop asks `checks_for` what to read and
never branches on a method's type (`convergent.train.checks.MethodChecks` drives them).

A check is a `MethodCheck`: every step it may take note of the step (`observe`); every
``every`` steps it reads the run (`read`); past a quarter of the run and at its end it decides
(`decide`). Each decision is an `ActingCheck`: the value read, its floor and the sentence a
run writes when it fails. This module sits below the algorithm packages, which may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn

__all__ = [
    "ActingCheck",
    "CheckFactory",
    "MethodCheck",
    "RunShape",
    "checks_for",
    "register_check",
]


@dataclass(frozen=True)
class ActingCheck:
    """One manipulation check on a run.

    Attributes:
        method: ``"HORST"``, ``"HAM"``, ``"Langevin"``, ``"descent"`` or ``"sparsity"``.
        name: a short key (``"mirror_acts"``, ``"noise_acts"``, ...).
        value: the measured value.
        threshold: what it is compared with.
        acted: whether the check passed.
        finding: what was measured, against what.
        advice: what it means when the check fails, and what to change.
    """

    method: str
    name: str
    value: float
    threshold: float
    acted: bool
    finding: str
    advice: str

    @property
    def message(self) -> str:
        """The warning line of a failed check: the finding, then the advice."""
        return f"{self.finding}: {self.advice}"

    @property
    def confirmation(self) -> str:
        """The line of a passed check."""
        return f"{self.method} acts: {self.finding}"

    def as_record(self) -> dict[str, object]:
        """A flat dict for logs and JSON (``check``, ``method``, ``value``, ...)."""
        return {
            "check": self.name,
            "method": self.method,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
        }


@dataclass(frozen=True)
class RunShape:
    """What a check knows of the run it reads.

    Attributes:
        max_steps: the run's length in optimizer steps.
        every: steps between readings.
    """

    max_steps: int
    every: int


class MethodCheck(Protocol):
    """One method's acting check: what it reads, when, and what it decides."""

    @property
    def proofs(self) -> tuple[str, ...]:
        """The names of its `ActingCheck` whose pass shows that the method acted (a run lists
        their confirmation lines); the others only warn."""
        ...

    def introduce(self, train_data: Any, task: str) -> str | None:
        """A line stating the method's strength in the units of a run on ``train_data`` (a
        map-style dataset of dict examples) for ``task``, logged before its first step; or
        None."""
        ...

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[ActingCheck]:
        """Step ``step`` has just taken its optimizer step (its gradients still in place,
        ``metrics`` its training metrics): the checks that decide now (most steps: none)."""
        ...

    def read(self, step: int) -> tuple[dict[str, float], list[ActingCheck]]:
        """A reading step: the readings that join the step's metrics, and the checks that
        decide at every reading."""
        ...

    def decide(
        self,
        step: int,
        losses: Sequence[tuple[int, float]],
        final: bool,
        model: nn.Module | None,
    ) -> list[ActingCheck]:
        """A reading past a quarter of the run (``final`` False), or the run's end (True):
        the checks that decide, given the train losses ``(step, loss)`` seen so far."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to decide as the uninterrupted one."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict` (read from the run's flat dict of every check's keys)."""
        ...


CheckFactory = Callable[[Any, RunShape], Sequence[MethodCheck]]
_FACTORIES: dict[type, CheckFactory] = {}


def register_check(method_type: type, factory: CheckFactory) -> None:
    """Declares the checks of the methods of type ``method_type`` (and of its subclasses that
    register none of their own).

    Args:
        method_type: an optimizer or training-step class.
        factory: ``factory(method, run)`` -> the `MethodCheck` objects of one run of
            ``method``; a wrapper returns its inner method's checks too (`checks_for`).
    """
    _FACTORIES[method_type] = factory


def checks_for(method: object, run: RunShape) -> list[MethodCheck]:
    """The checks registered for ``method``'s type (its closest registered class); none for a
    method that registered none (None included)."""
    for cls in type(method).__mro__:
        factory = _FACTORIES.get(cls)
        if factory is not None:
            return list(factory(method, run))
    return []
