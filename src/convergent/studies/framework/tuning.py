"""Equal tuning budgets: a declared grid per method, selected on the validation split only.

A method and its baseline each get a grid of the same size; every grid point is trained and
scored on the validation split, the best one is selected by the same criterion for every
method (the loop is the engine's, `convergent.studies.engine.select`), and the whole record
(each point's score, the selected point, whether it sits on the edge of its grid) goes into
``results.json``.

A selected value on the edge of a numeric axis of at least two values means the best point
may lie outside the grid; reports flag it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from convergent.studies.framework.numbers import finite_or_none

Run = TypeVar("Run")


@dataclass
class Tuning(Generic[Run]):
    """One method's grid search.

    Attributes:
        method: the method's name.
        axes: the grid, ``{hyperparameter: values}``.
        points: every grid point, in grid order.
        scores: the validation score of each point (NaN for a diverged run).
        runs: what ``run_point`` returned for each point (e.g. a trained model).
        selected: the index of the selected point.
        criterion: what the score is and which way is better.
    """

    method: str
    axes: dict[str, list[Any]]
    points: list[dict[str, Any]]
    scores: list[float]
    runs: list[Run]
    selected: int
    criterion: str

    @property
    def selected_point(self) -> dict[str, Any]:
        return self.points[self.selected]

    @property
    def selected_run(self) -> Run:
        return self.runs[self.selected]

    @property
    def on_edge(self) -> list[str]:
        """The numeric axes (of at least 2 values) whose selected value is the smallest or largest."""
        edges = []
        for name, values in self.axes.items():
            numeric = [v for v in values if isinstance(v, int | float)]
            if len(numeric) < 2 or len(numeric) != len(values):
                continue
            chosen = self.selected_point[name]
            if chosen in (min(numeric), max(numeric)):
                edges.append(name)
        return edges

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "criterion": self.criterion,
            "grid": self.axes,
            "points": [
                {**point, "validation": score if math.isfinite(score) else None}
                for point, score in zip(self.points, self.scores, strict=True)
            ],
            "selected": self.selected_point,
            "selected_validation": finite_or_none(self.scores[self.selected]),
            "on_edge": self.on_edge,
        }


def grid_points(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, the first axis varying slowest."""
    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values())]


def select_points(
    method: str,
    points: Sequence[Mapping[str, Any]],
    runs: Sequence[Run],
    score: Callable[[Run], float],
    *,
    maximize: bool,
    criterion: str,
) -> Tuning[Run]:
    """The selection over explicit ``points`` (a grid and its extensions; see
    :func:`extension_points`): the best validation score, ties to the first point. The axes
    recorded are every value each hyperparameter takes among the points."""
    scores = [_as_score(score(run)) for run in runs]
    finite = [i for i, s in enumerate(scores) if math.isfinite(s)]
    pick = max if maximize else min
    selected = pick(finite, key=lambda i: scores[i]) if finite else 0
    axes: dict[str, list[Any]] = {}
    for point in points:
        for name, value in point.items():
            axes.setdefault(name, [])
            if value not in axes[name]:
                axes[name].append(value)
    for values in axes.values():
        if all(isinstance(v, int | float) for v in values):
            values.sort()
    return Tuning(
        method=method,
        axes=axes,
        points=[dict(point) for point in points],
        scores=scores,
        runs=list(runs),
        selected=selected,
        criterion=f"{criterion} ({'higher' if maximize else 'lower'} is better)",
    )


def extension_points(tuning: Tuning[Any]) -> list[dict[str, Any]]:
    """One round of an equal-budget grid extension: for each numeric axis of at least two
    positive values, one new point beyond the end of the axis nearer the selected value (the
    end it sits on, when it is on an edge; the upper end on a tie), the other hyperparameters
    at their selected values. The new value continues the axis geometrically by the ratio of
    its two outermost values at that end (lr 4e-3, 8e-3 -> 1.6e-2).

    Every method of a study gets one point per such axis, so methods with the same number of
    axes keep equal budgets; a study extends every method's grid in the same round."""
    chosen = tuning.selected_point
    points = []
    for name, values in tuning.axes.items():
        numeric = sorted(v for v in values if isinstance(v, int | float))
        if len(numeric) < 2 or len(numeric) != len(values) or numeric[0] <= 0:
            continue
        index = numeric.index(chosen[name])
        upper = len(numeric) - 1 - index <= index
        if upper:
            value = numeric[-1] * numeric[-1] / numeric[-2]
        else:
            value = numeric[0] * numeric[0] / numeric[1]
        points.append({**chosen, name: float(f"{value:.6g}")})
    return points


def edge_note(tunings: Mapping[str, Tuning[Any]]) -> str | None:
    """A sentence for the report naming every selected point on its grid's edge, or None."""
    flagged = [
        f"{method} ({', '.join(f'{axis} {tuning.selected_point[axis]:g}' for axis in tuning.on_edge)})"
        for method, tuning in tunings.items()
        if tuning.on_edge
    ]
    if not flagged:
        return None
    return (
        "Selected on the edge of the grid, so the best value may lie outside it: "
        + ", ".join(flagged)
        + "."
    )


def _point_text(point: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:g}" if isinstance(v, int | float) else f"{k} {v}" for k, v in point.items()
    )


def _as_score(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number
