"""The descent regime pilot: its rule, and that it (and every grid run) reads no test frame."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from convergent.studies.descent import Config
from convergent.studies.descent import language as descent_language
from convergent.studies.descent import pilot as descent_pilot
from convergent.studies.descent import runs as descent_runs
from convergent.studies.descent.checks import BUMP_SHARE_FLOOR
from convergent.studies.framework import json_ready
from convergent.studies.framework import units as units_module

BUMPY = [0.2, 0.05, 0.06, 0.04]  # layer 2 rises 20 % above layer 1
SMOOTH = [0.2, 0.05, 0.045, 0.04]


def _base() -> Config:
    """The smoke config with two ERM grid points (weight decay 0.01, 0.1)."""
    return dataclasses.replace(
        Config.for_mode("smoke"), erm_weight_decays=(0.01, 0.1), constrained_costs=(10.0, None)
    )


def _fake_units(bumps: dict[int, tuple[int, ...]], jobs: list[Any]):
    """A stand-in for `video_unit`: weight decay 0.1 wins the selection at every depth, and
    its per-layer losses bump in the seeds ``bumps[layers]`` lists."""

    def unit(
        config: Config, method: str, point: dict[str, Any], seed: int, final: bool
    ) -> dict[str, Any]:
        jobs.append(("video", method, final, seed))
        selected = point["weight_decay"] == 0.1
        bumpy = selected and seed in bumps[config.denoiser_layers]
        return {
            "seed": seed,
            "validation_rmse_train_noise": 0.05,
            "validation_rmse_selection": 0.07 if selected else 0.08,
            "layer_losses": BUMPY if bumpy else SMOOTH,
            "multiplier_max": None,
            "multiplier_active_share": None,
        }

    return unit


@pytest.mark.parametrize(
    ("bumps", "tried", "chosen", "used"),
    [
        # 8 layers bump in 2 of 3 seeds: chosen, and 12 layers never run.
        ({8: (30, 32), 12: ()}, [8], 8, 8),
        # 8 layers bump in 1 of 3: 12 layers run, and bump in all 3.
        ({8: (31,), 12: (30, 31, 32)}, [8, 12], 12, 12),
        # Neither meets the rule: none chosen, the larger share used (ties: the first).
        ({8: (30,), 12: (32,)}, [8, 12], None, 8),
    ],
)
def test_the_pilot_chooses_the_first_depth_where_erm_bumps_in_two_of_three_seeds(
    monkeypatch, tmp_path, bumps, tried, chosen, used
):
    jobs: list[Any] = []
    monkeypatch.setattr(descent_pilot, "video_unit", _fake_units(bumps, jobs))
    result = descent_pilot.run_depth_pilot(tmp_path, workers=1, log=lambda line: None, base=_base())
    assert [row["layers"] for row in result["depths"]] == tried
    assert result["chosen"] == chosen and result["used"] == used
    for row in result["depths"]:
        assert row["selected"]["weight_decay"] == 0.1  # the study's video rule on validation
        assert row["bump_share"] == pytest.approx(len(bumps[row["layers"]]) / 3)
        assert row["largest_rise"][0] == pytest.approx(0.2 if 30 in bumps[row["layers"]] else -0.1)
    # ERM only, validation only: every run is an ERM grid (selection) job of the denoiser.
    assert {(part, method, final) for part, method, final, _ in jobs} == {("video", "erm", False)}
    assert {seed for *_, seed in jobs} == set(descent_pilot.PILOT_SEEDS)
    assert descent_pilot.PILOT_BUMP_SHARE > BUMP_SHARE_FLOOR  # a margin over the room check


def test_a_grid_run_of_the_denoiser_reads_no_test_frame(monkeypatch):
    """Test frames (the last 25 %) are white; every frame a grid run crops from is darker,
    and the test data's loader is never called."""
    config = Config.for_mode("smoke")
    frames = torch.randint(0, 200, (config.video_frames, 32, 32), dtype=torch.uint8)
    second = int(0.75 * config.video_frames)
    frames[second:] = 255
    read: list[int] = []
    crops = descent_runs.video_crops

    def recording_crops(split: torch.Tensor, *args: Any) -> torch.Tensor:
        read.append(int(split.max()))
        return crops(split, *args)

    def no_test(*args: Any) -> Any:
        raise AssertionError("a grid run asked for the test crops")

    monkeypatch.setattr(descent_runs, "load_street_video", lambda max_frames: frames)
    monkeypatch.setattr(descent_runs, "video_crops", recording_crops)
    monkeypatch.setattr(descent_runs, "video_test_data", no_test)
    descent_runs.video_selection_data.cache_clear()
    try:
        point = {"lr_scale": 1.0, "weight_decay": 0.01}
        unit = descent_runs.video_unit(config, "erm", point, 30, final=False)
    finally:
        descent_runs.video_selection_data.cache_clear()  # the fake frames must not linger
    assert math.isfinite(unit["validation_rmse_selection"]) and len(read) == 2
    assert max(read) < 255
    # The final run does read them, through the test loader.
    with pytest.raises(AssertionError, match="asked for the test crops"):
        descent_runs.video_unit(config, "erm", point, 30, final=True)
    descent_runs.video_selection_data.cache_clear()


COMMITTED_PILOT = (
    Path(__file__).resolve().parents[2] / "docs/results/pilots/descent-design3/descent-pilot"
)
# The numbers' fingerprint the committed pilot's units were keyed under (its files predate
# stored fingerprints; `tools/rekey_units.py` finds them keyed under this one).
PILOT_FINGERPRINT = "96dfc617399b4053"


def test_the_committed_pilot_reuses_every_unit_and_gives_its_committed_record(
    monkeypatch, tmp_path
):
    """Both pilots, resumed from a copy of the committed units with every unit's computation
    raising: each unit key is unchanged, and the record is the committed pilot.json."""

    def computed(*args: Any) -> Any:
        raise AssertionError(f"a pilot unit was computed: {args[1:5]}")

    for module, name in (
        (descent_pilot, "video_unit"),
        (descent_language, "language_unit"),
        (descent_language, "pretrain_unit"),
    ):
        monkeypatch.setattr(module, name, computed)
    monkeypatch.setattr(units_module, "numerics_fingerprint", lambda: PILOT_FINGERPRINT)
    folder = tmp_path / "descent-pilot"
    shutil.copytree(COMMITTED_PILOT, folder)
    result = descent_pilot.run_pilot(folder, workers=1, log=lambda line: None)
    committed = json.loads((COMMITTED_PILOT / "pilot.json").read_text())
    assert json.loads(json.dumps(json_ready(result))) == committed
