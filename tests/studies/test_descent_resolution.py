"""The clean claim's intervals: over seeds, over test sentences, and over both."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np
import pytest
from scipy import stats

from convergent.studies.framework.crossed import (
    crossed_interval,
    mark_differences,
    seed_half_width,
    seeds_to_resolve,
)


def _t_half(values: Sequence[float]) -> float:
    return stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def test_seed_half_width_and_the_seeds_a_margin_needs():
    per_seed = [-0.0066, -0.0057, 0.0076, -0.0170, -0.0095]
    assert seed_half_width(per_seed) == pytest.approx(_t_half(per_seed))
    assert math.isnan(seed_half_width([0.1])) and math.isnan(seed_half_width([0.1, math.nan]))
    spread = statistics.stdev(per_seed)
    for margin in (0.003, 0.01, 0.5):
        needed = next(
            n
            for n in range(2, 10**5)
            if stats.t.ppf(0.975, n - 1) * spread / math.sqrt(n) <= margin
        )
        assert seeds_to_resolve(spread, margin) == needed
    # Design 2's per-seed SD, 0.89 points: 37 seeds for 0.3 point, 6 for 1 point.
    assert seeds_to_resolve(0.0089, 0.003) == 37 and seeds_to_resolve(0.0089, 0.01) == 6
    assert seeds_to_resolve(math.nan, 0.003) is None and seeds_to_resolve(1.0, 1e-9) is None


def test_a_table_without_a_seed_effect_gives_the_paired_interval_over_sentences():
    # Every seed's row is the same: the seeds add nothing, the interval is the paired
    # t-interval over the sentences' differences, with N - 1 degrees of freedom.
    sentences = [1, 0, 0, -1, 1, 1, 0, 0, 0, 1, -1, 0]
    found = crossed_interval([sentences] * 4)
    assert found is not None
    mean = statistics.fmean(sentences)
    assert found.mean == pytest.approx(mean)
    assert found.half_width == pytest.approx(_t_half(sentences))
    assert found.degrees_of_freedom == pytest.approx(len(sentences) - 1)
    assert found.sentences_half_width == pytest.approx(_t_half(sentences))
    assert found.seeds_half_width == pytest.approx(0.0)  # every seed's mean is the same


def test_a_table_of_seed_shifts_alone_gives_the_seed_level_interval():
    # Each seed moves every sentence by the same amount: the interval is the seed-level one.
    shifts = [0.1, -0.2, 0.05, 0.3, -0.1]
    found = crossed_interval([[shift] * 8 for shift in shifts])
    assert found is not None
    assert found.half_width == pytest.approx(_t_half(shifts))
    assert found.degrees_of_freedom == pytest.approx(len(shifts) - 1)
    assert found.sentences_half_width == pytest.approx(0.0)


def test_refuses_ragged_tables_and_needs_two_seeds_and_two_sentences():
    with pytest.raises(ValueError, match="same test sentences"):
        crossed_interval([[1, 0], [1]])
    assert crossed_interval([[1, 0, 1]]) is None and crossed_interval([[1], [0]]) is None
    constant = crossed_interval([[1, 1], [1, 1]])
    assert constant is not None and constant.low == constant.high == 1.0


def _coverage(seed_sd: float, sentence_sd: float, replicates: int = 300) -> dict[str, float]:
    """How often each interval covers the true mean 0 on tables of 5 seeds x 200 sentences
    drawn as seed effect + sentence effect + noise (a new draw of both per replicate)."""
    rng = np.random.default_rng(0)
    hits = {"crossed": 0, "seeds": 0, "sentences": 0}
    for _ in range(replicates):
        table = (
            rng.normal(0, seed_sd, (5, 1))
            + rng.normal(0, sentence_sd, (1, 200))
            + rng.normal(0, 0.3, (5, 200))
        )
        found = crossed_interval(table.tolist())
        assert found is not None
        hits["crossed"] += found.low <= 0 <= found.high
        hits["seeds"] += abs(found.mean) <= found.seeds_half_width
        hits["sentences"] += abs(found.mean) <= found.sentences_half_width
    return {key: value / replicates for key, value in hits.items()}


def test_the_crossed_interval_covers_where_each_one_way_interval_misses_a_source():
    # A strong seed effect: the interval over sentences alone is far too narrow.
    seeds = _coverage(seed_sd=0.1, sentence_sd=0.0)
    assert seeds["sentences"] < 0.6 and seeds["crossed"] >= 0.9 and seeds["seeds"] >= 0.9
    # A strong sentence effect (a new test set each time): the seed-level one is too narrow.
    sentences = _coverage(seed_sd=0.0, sentence_sd=0.5)
    assert sentences["seeds"] < 0.7 and sentences["crossed"] >= 0.9
    assert sentences["sentences"] >= 0.9


def test_mark_differences_pairs_each_seeds_marks_and_leaves_out_a_seed_without_them():
    baseline = [[True, False, True], None, [1, 1, 0]]
    method = [[True, True, False], [True, False, False], [0, 1, 1]]
    table = mark_differences(zip((21, 22, 23), baseline, method, strict=True), "A", "B")
    # method minus baseline, sentence by sentence; seed 22 has no baseline marks
    assert table == [[0, 1, -1], [-1, 0, 1]]
    with pytest.raises(ValueError, match="seed 7: A marked 2 test sentences and B 3 at x; they"):
        mark_differences([(7, [1, 0], [1, 0, 1])], "A", "B", " at x")
