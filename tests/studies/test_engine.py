"""The study engine's loop: grid -> rule -> equal extensions -> finals, each run a cached unit.

The scores are closed-form functions of the point (a known best point), so the selected points
and the grids' growth are worked out by hand here.
"""

from __future__ import annotations

import math

import pytest

from convergent.studies.engine import Selection, Unit, run_finals, run_units, select, training_key
from convergent.studies.framework import UnitCache, edge_note

# AdamW's best lr is 2e-2, beyond its declared grid; HORST's best alpha is inside.
BEST = {"adamw": {"lr": 2e-2, "weight_decay": 0.1}, "horst": {"lr": 4e-3, "alpha": 10.0}}
GRIDS = {
    "adamw": {"lr": (2e-3, 4e-3, 8e-3), "weight_decay": (0.01, 0.1)},
    "horst": {"lr": (2e-3, 4e-3, 8e-3), "alpha": (3.0, 10.0)},
}


def closeness(method: str, point: dict) -> dict:
    """Minus the log-distance of ``point`` from ``method``'s best (top-level: a pool runs it)."""
    best = {k: v for k, v in BEST[method].items() if k in point}
    return {"validation": -sum(abs(math.log(point[k] / v)) for k, v in best.items())}


def _unit(method: str, point: dict) -> Unit:
    return Unit(training_key("toy", point, 0, False, method=method), closeness, (method, point))


def _by_score(_units: list[dict]):
    return lambda unit: unit["validation"]


@pytest.mark.parametrize("rounds", [0, 1, 2, 3])
def test_selections_on_an_edge_extend_every_grid_equally(tmp_path, rounds):
    cache = UnitCache(tmp_path, "toy", {"rounds": rounds}, design=1)
    selection = Selection(GRIDS, _unit, _by_score, True, "closeness", extension_rounds=rounds)
    tunings = select(selection, cache, 1, lambda line: None).tunings
    adamw, horst = tunings["adamw"], tunings["horst"]
    # Each round adds one point per axis to both grids while AdamW's lr sits on the edge:
    # 8e-3 -> 1.6e-2 (still the edge) -> 3.2e-2 (now 1.6e-2 is inside, and extension stops).
    used = min(rounds, 2)
    assert len(adamw.points) == len(horst.points) == 6 + 2 * used
    expected_lr = {0: 8e-3, 1: 1.6e-2, 2: 1.6e-2, 3: 1.6e-2}[rounds]
    assert adamw.selected_point == {"lr": expected_lr, "weight_decay": 0.1}
    assert horst.selected_point == {"lr": 4e-3, "alpha": 10.0}
    assert ("lr" in adamw.on_edge) == (rounds < 2)
    assert cache.misses == 12 + 4 * used  # every point trained once


def test_grids_of_different_sizes_are_refused(tmp_path):
    grids = {"adamw": {"lr": (1e-3, 2e-3)}, "horst": {"lr": (1e-3,)}}
    selection = Selection(grids, _unit, _by_score, True, "closeness")
    with pytest.raises(ValueError, match="same size"):
        select(selection, UnitCache(tmp_path, "toy", {}), 1, print)


def test_an_inheriting_method_trains_at_the_fields_its_predecessor_selected(tmp_path):
    grids = {"adamw": {"lr": (2e-3, 4e-3)}, "horst": {"alpha": (3.0, 10.0)}}

    def inherit(method, tunings):
        return {"lr": tunings["adamw"].selected_point["lr"]} if method == "horst" else {}

    cache = UnitCache(tmp_path, "toy", {}, design=1)
    selection = Selection(grids, _unit, _by_score, True, "closeness", inherit=inherit)
    selected = select(selection, cache, 1, lambda line: None)
    # AdamW's best lr 2e-2 -> 4e-3 is the nearer grid value; HORST runs there.
    assert selected.point("adamw") == {"lr": 4e-3}
    assert selected.point("horst") == {"alpha": 10.0, "lr": 4e-3}
    assert selected.tunings["horst"].points == [{"alpha": 3.0}, {"alpha": 10.0}]
    horst_keys = {cache.key(_unit("horst", {"alpha": a, "lr": 4e-3}).key) for a in (3.0, 10.0)}
    assert horst_keys <= {path.stem for path in tmp_path.glob("*.pt")}


def test_a_score_of_nan_is_never_selected_and_ties_go_to_the_first_point(tmp_path):
    grids = {"adamw": {"lr": (1e-3, 2e-3, 4e-3, 8e-3)}}

    def rule(_units):
        scores = {1e-3: 1.0, 2e-3: math.nan, 4e-3: 1.0, 8e-3: 0.5}
        return lambda unit: scores[unit["lr"]]

    def unit(method, point):
        return Unit({"method": method, **point}, dict, ((("lr", point["lr"]),),))

    selection = Selection(grids, unit, rule, True, "toy")
    tuning = select(selection, UnitCache(tmp_path, "toy", {}), 1, print).tunings["adamw"]
    assert tuning.selected_point == {"lr": 1e-3}


def test_finals_run_each_point_from_every_seed_grouped_by_method(tmp_path):
    cache = UnitCache(tmp_path, "toy", {}, design=1)
    points = {"adamw": {"lr": 2e-2, "weight_decay": 0.1}, "horst": {"lr": 4e-3, "alpha": 3.0}}

    def unit(method, point, seed):
        return Unit(
            training_key("toy", point, seed, True, method=method), closeness, (method, point)
        )

    runs = run_finals(cache, points, [3, 4, 5], unit, 1, lambda line: None)
    assert list(runs) == ["adamw", "horst"] and all(len(values) == 3 for values in runs.values())
    assert runs["adamw"][0] == {"validation": 0.0}
    assert runs["horst"][2] == pytest.approx({"validation": -math.log(10 / 3)})
    again = UnitCache(tmp_path, "toy", {}, design=1)
    assert run_units(again, [unit("horst", points["horst"], 4)]) == [runs["horst"][1]]
    assert again.hits == 1 and again.misses == 0


def test_a_loss_is_minimized_every_point_is_recorded_and_an_edge_is_named(tmp_path):
    grids = {"adamw": {"lr": (1e-4, 1e-3, 1e-2), "alpha": (1.0,)}}

    def unit(method, point):  # a loss, lowest at lr 1: beyond the grid's upper end
        return Unit({"method": method, **point}, loss_at, (point["lr"],))

    selection = Selection(grids, unit, lambda _: lambda u: u["loss"], False, "validation loss")
    tuning = select(selection, UnitCache(tmp_path, "toy", {}), 1, print).tunings["adamw"]
    record = tuning.to_json()
    assert record["selected"] == {"lr": 1e-2, "alpha": 1.0}
    assert record["on_edge"] == ["lr"]  # a one-value axis is fixed, not an edge
    assert [p["validation"] for p in record["points"]] == pytest.approx([16.0, 9.0, 4.0])
    assert record["criterion"] == "validation loss (lower is better)"
    assert "adamw (lr 0.01)" in edge_note({"adamw": tuning})


def loss_at(lr: float) -> dict:
    """(log10 lr)^2: lowest at lr 1 (top-level: a pool runs it)."""
    return {"loss": math.log10(lr) ** 2}
