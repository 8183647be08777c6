"""The record of the ``sparsity`` study's selections on validation that ``results.json`` keeps,
shared by its parts (the selection itself is the engine's `select`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convergent.studies.framework import Tuning


def selections_record(
    tunings: dict[str, Tuning[dict[str, Any]]], shown: str, scored: str
) -> dict[str, Any]:
    """Each optimizer's selected point and its grid as ``results.json`` keeps them: every point
    with its unit's ``scored`` validation number (as ``shown``), move ratio and strength."""
    return {
        "selected": {name: tuning.selected_point for name, tuning in tunings.items()},
        "selection": {
            name: [
                {
                    **point,
                    shown: unit[scored],
                    "move_ratio": unit["move_ratio"],
                    "strength": unit["strength"],
                }
                for point, unit in zip(tuning.points, tuning.runs, strict=True)
            ]
            for name, tuning in tunings.items()
        },
    }


def is_point(row: Mapping[str, Any], chosen: Mapping[str, Any]) -> bool:
    """Whether a stored grid row (a point's fields with its scores) is the ``chosen`` point."""
    return all(row.get(k) == v for k, v in chosen.items())
