"""The study engine: the loop every study runs (grid -> rule -> extend -> finals) and its
named selection rules, written once; a study supplies its units and the rules' parameters."""

from __future__ import annotations

from convergent.studies.engine.checks import CheckSpec
from convergent.studies.engine.claims import ClaimSpec
from convergent.studies.engine.run import (
    Rule,
    Selected,
    Selection,
    Unit,
    compute_unit,
    run_finals,
    run_units,
    select,
    training_key,
)

__all__ = [
    "CheckSpec",
    "ClaimSpec",
    "Rule",
    "Selected",
    "Selection",
    "Unit",
    "compute_unit",
    "run_finals",
    "run_units",
    "select",
    "training_key",
]
