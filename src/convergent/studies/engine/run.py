"""The loop every study runs: grid -> rule -> extend -> finals, each run a unit of the cache.

A study names its units and its rules; this module owns the loop around them, written once:

- :class:`Unit` is one run: its cache key (the fields every committed unit was stored under:
  part, method, the grid point's fields, seed, final, and whatever else the study's key holds)
  and the top-level function that computes it from plain arguments, so a process pool can run
  it. :func:`run_units` reads finished units back from the cache and computes the rest.
- :func:`select` trains every method's declared grid on the selection seed, scores each point
  with the study's rule (validation numbers only: a selection unit never reads the test split)
  and, while a selection sits on an edge of its grid, extends every grid by the same number of
  points (:func:`~convergent.studies.framework.tuning.extension_points`) for up to
  ``extension_rounds`` rounds. A method whose grid takes fields from the methods selected
  before it (``inherit``) waits for them; the others run side by side.
- :func:`run_finals` trains each selected point from every final seed, grouped by method in
  seed order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from convergent.studies.framework.tuning import (
    Tuning,
    extension_points,
    grid_points,
    select_points,
)
from convergent.studies.framework.units import UnitCache, run_jobs

Log = Callable[[str], None]
# A rule: from the units a selection may compare (a method's grid, or every method's), the
# score of one unit (NaN: never selected).
Rule = Callable[[list[dict[str, Any]]], Callable[[dict[str, Any]], float]]


@dataclass(frozen=True)
class Unit:
    """One run of a study: ``compute(*arguments)`` stored under ``key`` in the unit cache.

    Attributes:
        key: the unit's description in the cache key (unchanged from the committed units').
        compute: a top-level function (a process pool pickles it by name).
        arguments: plain values: the study's config, the point, the seed.
        threads: torch threads in the process that computes it (None: leave them).
    """

    key: Mapping[str, Any]
    compute: Callable[..., Any]
    arguments: tuple[Any, ...] = ()
    threads: int | None = None

    def unit(self) -> Mapping[str, Any]:
        return self.key


def training_key(
    part: str, point: Mapping[str, Any], seed: int, final: bool, **fields: Any
) -> dict[str, Any]:
    """The cache key of one training run: its part, the study's own fields (the method under
    the study's name for it), the grid point's fields, seed and final."""
    return {"part": part, **fields, **point, "seed": seed, "final": final}


def compute_unit(unit: Unit) -> Any:
    """What ``unit`` computes (top-level, so that a pool worker can call it)."""
    if unit.threads is not None:
        torch.set_num_threads(unit.threads)
    return unit.compute(*unit.arguments)


def run_units(
    cache: UnitCache, units: Sequence[Unit], workers: int = 1, log: Log | None = None
) -> list[Any]:
    """Each unit's value, read back from ``cache`` or computed (on ``workers`` processes), in
    order."""
    return run_jobs(cache, units, compute_unit, workers, log)


@dataclass(frozen=True)
class Selection:
    """How one experiment selects each method's point on validation.

    Attributes:
        grids: ``{method: {hyperparameter: values}}``, every grid the same size.
        unit: the selection unit of a method's point (``unit(method, point)``).
        rule: the score, from the units it compares (see ``per_method``).
        maximize: whether a higher score is better.
        criterion: the score's name for the record.
        per_method: the rule compares a method's own grid (True) or every method's (False).
        extension_rounds: how many equal extensions an edge selection may get.
        inherit: ``inherit(method, tunings so far)``: fields a method's points take from the
            methods selected before it (e.g. the baseline's learning rate), or None.
    """

    grids: Mapping[str, Mapping[str, Sequence[Any]]]
    unit: Callable[[str, dict[str, Any]], Unit]
    rule: Rule
    maximize: bool
    criterion: str
    per_method: bool = False
    extension_rounds: int = 0
    inherit: Callable[[str, Mapping[str, Tuning[Any]]], dict[str, Any]] | None = field(default=None)


@dataclass(frozen=True)
class Selected:
    """Each method's grid search (`Tuning`; its points are the grid's, as declared) and the
    fields its units took from the methods selected before it."""

    tunings: dict[str, Tuning[dict[str, Any]]]
    inherited: dict[str, dict[str, Any]]

    def point(self, method: str) -> dict[str, Any]:
        """What ``method``'s final runs train: its selected point and inherited fields."""
        return {**self.tunings[method].selected_point, **self.inherited[method]}

    def points(self) -> dict[str, dict[str, Any]]:
        return {method: self.point(method) for method in self.tunings}


def select(selection: Selection, cache: UnitCache, workers: int, log: Log) -> Selected:
    """Each method's selection on validation (see the module's docstring)."""
    sizes = {method: len(grid_points(axes)) for method, axes in selection.grids.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every method needs a grid of the same size, got {sizes}")
    points = {method: grid_points(axes) for method, axes in selection.grids.items()}
    units: dict[str, list[dict[str, Any]]] = {method: [] for method in points}
    tunings: dict[str, Tuning[dict[str, Any]]] = {}
    inherited: dict[str, dict[str, Any]] = {method: {} for method in points}

    def train(new: Mapping[str, list[dict[str, Any]]]) -> None:
        jobs = [
            (m, selection.unit(m, {**point, **inherited[m]}))
            for m, listed in new.items()
            for point in listed
        ]
        done = run_units(cache, [unit for _, unit in jobs], workers, log)
        for (method, _), value in zip(jobs, done, strict=True):
            units[method].append(value)

    def choose(methods: Sequence[str]) -> None:
        every = [unit for listed in units.values() for unit in listed]
        for method in methods:
            score = selection.rule(units[method] if selection.per_method else every)
            tunings[method] = select_points(
                method,
                points[method],
                units[method],
                score,
                maximize=selection.maximize,
                criterion=selection.criterion,
            )

    if selection.inherit is None:
        train(points)
        choose(list(points))
    else:  # one method after another: each takes fields from those selected before it
        for method in points:
            inherited[method] = selection.inherit(method, tunings)
            train({method: points[method]})
            choose([method])
    for round_ in range(selection.extension_rounds):
        if not any(tuning.on_edge for tuning in tunings.values()):
            break
        new = {method: extension_points(tuning) for method, tuning in tunings.items()}
        if len({len(listed) for listed in new.values()}) != 1:
            raise ValueError(
                "an extension must give every method the same number of points, got "
                + ", ".join(f"{method} {len(listed)}" for method, listed in new.items())
            )
        log(f"extension round {round_ + 1}: " + "; ".join(f"{m} {v}" for m, v in new.items()))
        for method, listed in new.items():
            points[method] += listed
        train(new)
        choose(list(points))
    for method, tuning in tunings.items():
        edge = f" (on the edge of its grid: {', '.join(tuning.on_edge)})" if tuning.on_edge else ""
        log(f"{method}: selected {tuning.selected_point} of {len(tuning.points)} points{edge}")
    return Selected(tunings, inherited)


def run_finals(
    cache: UnitCache,
    points: Mapping[str, dict[str, Any]],
    seeds: Sequence[int],
    unit: Callable[[str, dict[str, Any], int], Unit],
    workers: int,
    log: Log,
) -> dict[str, list[Any]]:
    """Each method's point (`Selected.points`) trained from every seed (``unit(method, point,
    seed)``): ``{method: [value per seed]}``, methods in order, then seeds."""
    jobs = [(m, unit(m, point, seed)) for m, point in points.items() for seed in seeds]
    values = run_units(cache, [job for _, job in jobs], workers, log)
    runs: dict[str, list[Any]] = {method: [] for method in points}
    for (method, _), value in zip(jobs, values, strict=True):
        runs[method].append(value)
    return runs
