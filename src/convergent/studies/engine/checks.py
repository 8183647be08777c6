"""A manipulation check as a record: its name, bound, how its readings are summed up, and why.

Most checks have one shape: a list of readings (one per seed, run or layer) summed up by the
smallest, the largest or the mean, held to a bound, with a note saying why the bound is what it
is; where the readings are missing the check is "not measured" (the claim is then untested),
with a sentence saying what is missing. A study declares the record and computes the readings;
`CheckSpec.check` does the rest, the same way for every study.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from convergent.studies.framework.claims import Check, Threshold, not_measured

# How readings that are not finite count: ``"all"`` (any makes the check not measured),
# ``"dropped"`` (left out; the rest decide) or ``"kept"`` (summed up with the rest).
Finite = Literal["all", "dropped", "kept"]
SUMMARIES: dict[str, Callable[[Sequence[float]], float]] = {
    "min": min,
    "max": max,
    "mean": lambda values: float(np.mean(values)),
}


@dataclass(frozen=True)
class CheckSpec:
    """One manipulation check, declared.

    Attributes:
        name: what is measured, as the report shows it.
        required: the bound (`at_least`, `at_most`, `within`).
        summary: ``"min"``, ``"max"`` or ``"mean"`` of the readings.
        note: why the bound is what it is.
        missing: what is missing when the check cannot be measured.
        finite: how readings that are not finite count (see `Finite`).
    """

    name: str
    required: Threshold
    summary: str
    note: str
    missing: str
    finite: Finite = "all"

    def check(self, readings: Sequence[float], note: str | None = None) -> Check:
        """The check on ``readings`` (``note`` in place of the declared one, e.g. with what
        the readings showed)."""
        values = [float(value) for value in readings]
        if self.finite == "dropped":
            values = [value for value in values if math.isfinite(value)]
        absent = not values or (self.finite == "all" and not all(map(math.isfinite, values)))
        if absent:
            return not_measured(self.name, self.required, self.missing)
        value = SUMMARIES[self.summary](values)
        return Check(self.name, value, self.required, note=self.note if note is None else note)
