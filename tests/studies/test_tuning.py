"""The equal-budget tuning helper: same grid sizes, validation-only selection, edge flags."""

from __future__ import annotations

import math

import pytest

from convergent.studies.framework.tuning import TuningData, edge_note, grid_points, tune


class _Untouchable:
    """A dataset that raises on any access: the tuning helper must never read it."""

    def __getattr__(self, name):
        raise AssertionError(f"the test split was read ({name})")

    def __len__(self):
        raise AssertionError("the test split was read (len)")

    def __getitem__(self, index):
        raise AssertionError("the test split was read (item)")


def _quadratic(best: float):
    """A validation score that peaks at lr = best (higher is better)."""

    def run_point(method, point, data):
        assert set(vars(data)) == {"train", "validation"}
        return {"method": method, "score": -((math.log10(point["lr"]) - math.log10(best)) ** 2)}

    return run_point


def test_grid_points_is_the_cartesian_product_first_axis_slowest():
    assert grid_points({"lr": [1, 2], "alpha": ["a", "b", "c"]}) == [
        {"lr": 1, "alpha": "a"},
        {"lr": 1, "alpha": "b"},
        {"lr": 1, "alpha": "c"},
        {"lr": 2, "alpha": "a"},
        {"lr": 2, "alpha": "b"},
        {"lr": 2, "alpha": "c"},
    ]


def test_selects_each_methods_best_point_on_validation_and_records_every_point():
    lrs = [1e-4, 1e-3, 1e-2]
    lines = []
    result = tune(
        {"adamw": {"lr": lrs}, "horst": {"lr": lrs}},
        _quadratic(1e-3),
        lambda run: run["score"],
        TuningData(train=[1, 2], validation=[3]),
        maximize=True,
        criterion="validation accuracy",
        log=lines.append,
    )
    for method in ("adamw", "horst"):
        record = result[method].to_json()
        assert record["selected"] == {"lr": 1e-3} and record["on_edge"] == []
        assert [p["lr"] for p in record["points"]] == lrs
        assert record["points"][1]["validation"] == pytest.approx(0.0)
        assert record["criterion"] == "validation accuracy (higher is better)"
        assert result[method].selected_run["method"] == method
    assert len(lines) == 2 and "selected lr 0.001" in lines[0]
    assert edge_note(result) is None


def test_flags_a_choice_on_the_edge_and_minimizes_when_asked():
    result = tune(
        {"adamw": {"lr": [1e-4, 1e-3, 1e-2], "alpha": [1.0]}},
        _quadratic(1.0),
        lambda run: -run["score"],  # a loss: lower is better
        TuningData(train=None, validation=None),
        maximize=False,
        criterion="validation loss",
    )
    assert result["adamw"].selected_point == {"lr": 1e-2, "alpha": 1.0}
    assert result["adamw"].on_edge == ["lr"]  # a one-value axis is fixed, not an edge
    assert "adamw (lr 0.01)" in edge_note(result)


def test_a_diverged_point_is_never_selected():
    scores = {1e-4: 0.5, 1e-3: math.nan, 1e-2: 0.4}
    result = tune(
        {"m": {"lr": list(scores)}},
        lambda method, point, data: scores[point["lr"]],
        lambda run: run,
        TuningData(None, None),
        maximize=True,
        criterion="accuracy",
    )
    assert result["m"].selected_point == {"lr": 1e-4}
    assert result["m"].to_json()["points"][1]["validation"] is None


def test_grids_of_different_sizes_are_refused():
    with pytest.raises(ValueError, match="same size"):
        tune(
            {"adamw": {"lr": [1, 2, 3]}, "horst": {"lr": [1, 2], "alpha": [1, 2]}},
            lambda *args: 0.0,
            lambda run: run,
            TuningData(None, None),
            maximize=True,
            criterion="accuracy",
        )


def test_the_helper_never_reads_the_test_split():
    """run_point gets the train and validation splits only; there is no test split to reach."""
    test = _Untouchable()
    seen = []

    def run_point(method, point, data):
        seen.append(data)
        with pytest.raises(AttributeError):
            data.test  # noqa: B018
        return len(data.validation)

    tune(
        {"m": {"lr": [1, 2]}},
        run_point,
        lambda run: run,
        TuningData(train=[0, 1, 2], validation=[0]),
        maximize=True,
        criterion="accuracy",
    )
    assert len(seen) == 2 and all(data.validation == [0] for data in seen)
    with pytest.raises(AssertionError, match="the test split was read"):
        len(test)


def test_the_tuning_table_shows_every_methods_own_axes():
    from convergent.studies.framework.common import tuning_lines

    record = {
        "criterion": "validation accuracy (higher is better)",
        "on_edge": [],
    }
    tuning = {
        "(a) grid": {
            "adamw": {
                **record,
                "points": [{"lr": 0.001, "weight_decay": 0.1, "validation": 0.5}],
                "selected": {"lr": 0.001, "weight_decay": 0.1},
            },
            "horst": {
                **record,
                "points": [{"lr": 0.001, "alpha": 30.0, "validation": 0.6}],
                "selected": {"lr": 0.001, "alpha": 30.0},
            },
        }
    }
    table = [line for line in "\n".join(tuning_lines(tuning)).splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == ["method", "lr", "weight_decay", "alpha", "validation", "selected"]
    horst = [cell.strip() for cell in table[3].strip("|").split("|")]
    assert horst[header.index("alpha")] == "30.0000"
    assert horst[header.index("weight_decay")] == ""


def test_an_extension_round_adds_one_point_per_axis_beyond_the_nearer_end():
    from convergent.studies.framework import extension_points, select_points

    points = [{"lr": lr, "wd": wd} for lr in (1e-3, 2e-3, 4e-3) for wd in (0.01, 0.1)]
    scores = {(4e-3, 0.1): 0.9}  # selected on both upper edges
    tuning = select_points(
        "m", points, points, lambda p: scores.get((p["lr"], p["wd"]), 0.5),
        maximize=True, criterion="acc",
    )  # fmt: skip
    assert tuning.selected_point == {"lr": 4e-3, "wd": 0.1}
    assert tuning.on_edge == ["lr", "wd"]
    assert extension_points(tuning) == [{"lr": 8e-3, "wd": 0.1}, {"lr": 4e-3, "wd": 1.0}]
    # On the lower edges the axes continue downwards by their lowest ratio.
    low = select_points("m", points, points, lambda p: -p["lr"] - p["wd"], maximize=True,
                        criterion="acc")  # fmt: skip
    assert extension_points(low) == [{"lr": 5e-4, "wd": 0.01}, {"lr": 1e-3, "wd": 0.001}]
    # An interior lr still gets its one point (equal budgets), beyond the upper end on a tie.
    middle = select_points("m", points, points, lambda p: -abs(p["lr"] - 2e-3) + p["wd"],
                           maximize=True, criterion="acc")  # fmt: skip
    assert middle.on_edge == ["wd"]
    assert extension_points(middle) == [{"lr": 8e-3, "wd": 0.1}, {"lr": 2e-3, "wd": 1.0}]
    extended = [*points, *extension_points(tuning)]
    again = select_points("m", extended, extended, lambda p: p["lr"] == 8e-3, maximize=True,
                          criterion="acc")  # fmt: skip
    assert again.axes == {"lr": [1e-3, 2e-3, 4e-3, 8e-3], "wd": [0.01, 0.1, 1.0]}
    assert again.selected_point == {"lr": 8e-3, "wd": 0.1} and again.on_edge == ["lr"]
