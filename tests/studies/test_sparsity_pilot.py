"""The sparsity study's regime pilot: its declared candidates and how it chooses among them.

The runs themselves are replaced by a table of validation accuracies written here (a real run
trains for minutes), so the choice is checked against numbers whose right answer is plain.
"""

from __future__ import annotations

import pytest

from convergent.studies.sparsity import pilot, vision_model
from convergent.studies.sparsity.config import VISION_MASKS
from convergent.studies.sparsity.models import vision_data


@pytest.mark.parametrize("regime", pilot.PILOT_REGIMES, ids=lambda r: r["name"])
def test_every_candidate_has_at_least_100k_prunable_weights_and_reads_validation_only(regime):
    config = pilot.pilot_config(regime)
    assert config.optimizers == ("adamw",)
    assert config.selection_seed == pilot.PILOT_SEED >= 20
    assert len(config.adamw_lrs) * len(config.adamw_weight_decays) == 12
    splits, *_ = vision_data(config.image_size, config.patch, 10, 10, 10)
    model = vision_model(
        splits, config.vit_d_model, config.vit_layers, config.vit_heads, config.vit_d_ff
    )
    names = VISION_MASKS.select(model).names
    prunable = sum(p.numel() for n, p in model.named_parameters() if n in set(names))
    assert prunable >= 100_000


def _fake_runs(monkeypatch, accuracies):
    """Each run's validation accuracy from ``accuracies[(regime's d_model, steps)]``: a
    function of (lr, weight decay, sparsity)."""
    seen = []

    def fake(config, optimizer, point, seed, sparsity, final):
        regime = (config.vit_d_model, config.vit_steps)
        seen.append((regime, point["lr"], point["weight_decay"], sparsity, seed))
        score = accuracies[regime](point["lr"], point["weight_decay"], sparsity)
        return {"validation_accuracy": score, "seconds": 1.0}

    monkeypatch.setattr(pilot, "timed_vision_unit", fake)
    return seen


def test_the_pilot_selects_each_grid_best_and_stops_at_the_first_candidate_losing_4_points(
    monkeypatch, tmp_path
):
    def small_drop(lr, weight_decay, sparsity):
        # best sparse point lr 1e-3, wd 0.1 (0.80); dense there 0.82: a 2-point drop
        if sparsity is None:
            return 0.82
        return 0.80 if (lr, weight_decay) == (1e-3, 0.1) else 0.70

    def large_drop(lr, weight_decay, sparsity):
        # best sparse point at the grid's lr edge 8e-3 (0.75); dense 0.80: a 5-point drop
        if sparsity is None:
            return 0.80
        return 0.75 if (lr, weight_decay) == (8e-3, 0.01) else 0.60

    seen = _fake_runs(monkeypatch, {(128, 2000): small_drop, (64, 2000): large_drop})
    result = pilot.run_pilot(tmp_path, workers=1, log=lambda line: None)
    first, second = result["regimes"]
    assert first["selected"] == {"lr": 1e-3, "weight_decay": 0.1}
    assert first["drop"] == pytest.approx(0.02) and first["on_edge"] == ["weight decay 0.1"]
    assert second["selected"] == {"lr": 8e-3, "weight_decay": 0.01}
    assert second["drop"] == pytest.approx(0.05)
    assert second["on_edge"] == ["lr 0.008", "weight decay 0.01"]
    assert result["chosen"] == result["used"] == "d64 4x4 2000 steps"
    # The third candidate never ran; every run used the pilot's seed; 12 grid points + 1 dense.
    assert {regime for regime, *_ in seen} == {(128, 2000), (64, 2000)}
    assert {seed for *_, seed in seen} == {pilot.PILOT_SEED}
    assert len(seen) == 2 * 13
    # Resumed: a second call computes nothing.
    seen.clear()
    pilot.run_pilot(tmp_path, workers=1, log=lambda line: None)
    assert seen == []


def test_without_a_candidate_losing_4_points_the_largest_drop_is_used(monkeypatch, tmp_path):
    def drop_of(points):
        def score(lr, weight_decay, sparsity):
            return 0.8 if sparsity is None else 0.8 - points / 100

        return score

    _fake_runs(
        monkeypatch,
        {(128, 2000): drop_of(1), (64, 2000): drop_of(3), (128, 3000): drop_of(2)},
    )
    result = pilot.run_pilot(tmp_path, workers=1, log=lambda line: None)
    assert result["chosen"] is None
    assert result["used"] == "d64 4x4 2000 steps"
    assert [round(row["drop"], 6) for row in result["regimes"]] == [0.01, 0.03, 0.02]


COMMITTED_NUMERICS = "96dfc617399b4053"


def test_the_pilots_cache_finds_its_committed_units():
    # The pilot keeps its own unit design and leaves the LM-only fields added after its units
    # were stored out of their key: its first candidate's 12 grid points and dense run, committed
    # in docs/results/pilots/sparsity-design3/, must still be found (not recomputed).
    from pathlib import Path

    from convergent.studies.sparsity.runs import vision_run

    out = (
        Path(__file__).resolve().parents[2] / "docs/results/pilots/sparsity-design3/sparsity-pilot"
    )
    config = pilot.pilot_config(pilot.PILOT_REGIMES[0])
    cache = pilot.pilot_cache(out, config)
    sparse = [
        (point, vision_run(config, "adamw", point, pilot.PILOT_SEED, pilot.PILOT_SPARSITY, False))
        for point in (
            {"lr": lr, "weight_decay": weight_decay}
            for lr in pilot.PILOT_ADAMW_LRS
            for weight_decay in pilot.PILOT_ADAMW_WEIGHT_DECAYS
        )
    ]

    # The files were keyed under the numbers of the Intel Xeon that computed them (commit
    # b4d0c59); another CPU's fingerprint keys other files, so the lookup names theirs.
    def stored(unit: dict) -> bool:
        return (cache.folder / f"{cache.key(unit, numerics=COMMITTED_NUMERICS)}.pt").is_file()

    assert all(stored(run.key) for _, run in sparse)
    dense = [
        vision_run(config, "adamw", point, pilot.PILOT_SEED, None, False).key for point, _ in sparse
    ]
    assert sum(stored(key) for key in dense) == 1  # at the selected point only
