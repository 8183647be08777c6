"""The tuning record: grid points, edge flags and extension points (the loop is the engine's:
tests/studies/test_engine.py)."""

from __future__ import annotations

from convergent.studies.framework.tuning import grid_points


def test_grid_points_is_the_cartesian_product_first_axis_slowest():
    assert grid_points({"lr": [1, 2], "alpha": ["a", "b", "c"]}) == [
        {"lr": 1, "alpha": "a"},
        {"lr": 1, "alpha": "b"},
        {"lr": 1, "alpha": "c"},
        {"lr": 2, "alpha": "a"},
        {"lr": 2, "alpha": "b"},
        {"lr": 2, "alpha": "c"},
    ]


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
