from __future__ import annotations

import json
from dataclasses import replace

import pytest

from convergent.studies.common import write_study
from convergent.studies.langevin import Config, run
from convergent.studies.langevin_report import relative_growth, trend


def test_relative_growth_of_a_line_and_a_plateau():
    line = [{"step": step, "x": 1.0 + step / 100} for step in range(0, 101, 10)]
    # From 1.5 to 2.0 over the second half, around a mean of 1.75.
    assert relative_growth(line, "x") == pytest.approx(0.5 / 1.75)
    plateau = [{"step": step, "x": 3.0} for step in range(0, 101, 10)]
    assert relative_growth(plateau, "x") == 0.0
    zigzag = [
        {"step": step, "x": step / 100 + (0.3 if step % 20 else -0.3)} for step in range(0, 101, 10)
    ]
    assert trend(zigzag, "x") == pytest.approx(1.0, abs=0.15)  # the noise averages out


def test_modes_are_sized_as_documented():
    smoke, quick, full = (Config.for_mode(mode) for mode in ("smoke", "quick", "full"))
    assert len(full.seeds) >= 3 and len(quick.seeds) == 1
    assert smoke.langevin_steps < quick.langevin_steps <= full.langevin_steps
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")


def test_smoke_run_writes_report_json_and_figures(tmp_path):
    result = run(Config.for_mode("smoke"), tmp_path, progress=False)
    report = write_study(result, tmp_path)
    payload = json.loads((tmp_path / "results.json").read_text())
    assert result.name == "langevin" and payload["mode"] == "smoke"
    assert all(claim.reproduced is None for claim in result.claims)  # smoke decides nothing
    assert len(result.claims) == 8
    for figure in result.figures:
        assert (tmp_path / figure).stat().st_size > 0
    text = report.read_text()
    assert "W_Q, W_K under Langevin" in text and "LoRA factors under Langevin" in text
    runs = payload["data"]["runs"]
    for experiment, keys in (
        ("attention", ("query", "key")),
        ("lora", ("lora_A", "lora_B", "lora_BA")),
    ):
        traces = runs[experiment][0]["traces"]
        assert set(traces) == {"none", "log", "power"}
        for trace in traces.values():
            assert trace[-1]["step"] == Config.for_mode("smoke").langevin_steps
            assert all(key in trace[-1] for key in (*keys, "train_rmse", "test_rmse", "gap"))
        assert runs[experiment][0]["lam"]["none"] == 0.0 and runs[experiment][0]["lam"]["log"] > 0
    villani = runs["attention"][0]["villani"]
    # Along the ray the regularized potential's Villani quantity grows faster than without.
    assert villani["log"][-1]["villani"] > villani["none"][-1]["villani"]


def test_verdicts_are_decided_outside_smoke_mode(tmp_path):
    config = replace(Config.for_mode("smoke"), mode="quick", variants=("none", "log"))
    result = run(config, tmp_path, progress=False)
    assert all(claim.reproduced in (True, False) for claim in result.claims)


def test_parallel_jobs_give_the_same_numbers_as_one_process(tmp_path):
    config = replace(Config.for_mode("smoke"), variants=("none",), langevin_steps=10)
    alone = run(config, tmp_path / "one", progress=False).data["runs"]
    parallel = run(replace(config, workers=2), tmp_path / "two", progress=False).data["runs"]
    assert json.dumps(parallel, sort_keys=True) == json.dumps(alone, sort_keys=True)
