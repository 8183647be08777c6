"""Gradual magnitude pruning's schedule against the cubic formula of Zhu and Gupta (2017)."""

from __future__ import annotations

import pytest

from convergent.sparse import GradualSchedule


@pytest.mark.parametrize(
    ("initial", "final", "start", "end", "dt"), [(0.0, 0.9, 10, 110, 10), (0.5, 0.75, 0, 30, 3)]
)
def test_the_schedule_is_the_cubic_formula_held_between_updates(initial, final, start, end, dt):
    schedule = GradualSchedule(final, start, end, frequency=dt, initial_sparsity=initial)
    n = (end - start) // dt
    for step in range(end + 25):
        if step < start:
            want = 0.0
        else:
            t = start + min((step - start) // dt, n) * dt  # the last update at or before step
            want = final + (initial - final) * (1 - (t - start) / (n * dt)) ** 3
        assert schedule.sparsity_at(step) == pytest.approx(want, abs=1e-15), step
        assert schedule.is_update(step) == (start <= step <= end and (step - start) % dt == 0)
    assert schedule.sparsity_at(start) == pytest.approx(initial)
    assert schedule.sparsity_at(end) == pytest.approx(final)
    values = [schedule.sparsity_at(step) for step in range(end + 5)]
    assert values == sorted(values)  # never less sparse later


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"final_sparsity": 1.0, "start_step": 0, "end_step": 10}, "final_sparsity must be in"),
        ({"final_sparsity": 0.5, "start_step": 0, "end_step": 10, "initial_sparsity": 0.6},
         r"initial_sparsity must be in \[0, final_sparsity = 0.5\], got 0.6"),
        ({"final_sparsity": 0.5, "start_step": 5, "end_step": 5}, "end_step must be > start_step"),
        ({"final_sparsity": 0.5, "start_step": 0, "end_step": 10, "frequency": 3},
         "frequency must be an integer >= 1 that divides end_step - start_step = 10, got 3"),
        ({"final_sparsity": 0.5, "start_step": -1, "end_step": 10}, "start_step must be >= 0"),
    ],
)  # fmt: skip
def test_bad_schedules_are_one_sentence(options, message):
    with pytest.raises(ValueError, match=message):
        GradualSchedule(**options)


@pytest.mark.parametrize("total_steps", [2, 3, 10, 99, 100, 300, 1000, 4321, 100_000])
def test_a_runs_default_prunes_from_a_tenth_to_three_quarters_in_at_most_20_updates(total_steps):
    schedule = GradualSchedule.over_run(total_steps, 0.8)
    assert schedule.start_step == int(0.1 * total_steps)
    assert schedule.end_step <= max(int(0.75 * total_steps), schedule.start_step + 1)
    intervals = (schedule.end_step - schedule.start_step) // schedule.frequency
    assert (schedule.end_step - schedule.start_step) % schedule.frequency == 0
    assert 1 <= intervals <= 20  # 300 steps: 195 // 9 = 21 with the frequency rounded down
    # the ramp still spans most of the window: at most one interval short of 75 %
    assert schedule.end_step + schedule.frequency > int(0.75 * total_steps)
