"""The ``sparsity`` study's selection on validation, shared by its parts: each optimizer's
declared grid (every grid the same size), equal extensions while a selection lies on an edge,
and the record of each grid that ``results.json`` keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from convergent.studies.framework import (
    Tuning,
    UnitCache,
    extension_points,
    grid_points,
    run_jobs,
    select_points,
)


def select_on_validation(
    config: Any,
    grids: dict[str, dict[str, tuple[float, ...]]],
    job_of: Callable[[str, dict[str, Any]], Any],
    unit_of: Callable[[Any], dict[str, Any]],
    scorer: Callable[[list[dict[str, Any]]], Callable[[dict[str, Any]], float]],
    maximize: bool,
    criterion: str,
    cache: UnitCache,
    log: Callable[[str], None],
) -> dict[str, Tuning[dict[str, Any]]]:
    """Each optimizer's selection on validation: its declared grid (every grid the same size),
    then up to ``config.extension_rounds`` equal extensions while any selection lies on an edge
    of its grid: every optimizer gets one point beyond the nearer end of each axis
    (`extension_points`), so the budgets stay equal. ``scorer`` makes the score from every
    unit trained so far (the LM's dense floor reads every grid)."""
    points = {name: grid_points(axes) for name, axes in grids.items()}
    units: dict[str, list[dict[str, Any]]] = {name: [] for name in grids}

    def train(new: dict[str, list[dict[str, Any]]]) -> None:
        jobs = [(name, job_of(name, point)) for name, listed in new.items() for point in listed]
        done = run_jobs(cache, [job for _, job in jobs], unit_of, config.workers, log)
        for (name, _), unit in zip(jobs, done, strict=True):
            units[name].append(unit)

    train(points)
    for round_ in range(config.extension_rounds + 1):
        score = scorer([unit for listed in units.values() for unit in listed])
        tunings = {
            name: select_points(
                name, points[name], units[name], score, maximize=maximize, criterion=criterion
            )
            for name in grids
        }
        if round_ == config.extension_rounds or not any(t.on_edge for t in tunings.values()):
            break
        new = {name: extension_points(tuning) for name, tuning in tunings.items()}
        if len({len(listed) for listed in new.values()}) != 1:
            raise ValueError(
                "an extension must give every optimizer the same number of points, got "
                + ", ".join(f"{name} {len(listed)}" for name, listed in new.items())
            )
        log(f"extension round {round_ + 1}: " + "; ".join(f"{n} {v}" for n, v in new.items()))
        for name, listed in new.items():
            points[name] += listed
        train(new)
    for name, tuning in tunings.items():
        edge = f" (on the edge of its grid: {', '.join(tuning.on_edge)})" if tuning.on_edge else ""
        log(f"{name}: selected {tuning.selected_point} of {len(tuning.points)} points{edge}")
    return tunings


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
