"""Resumable studies: finished units are reused, stale ones never are."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from convergent.studies.framework import units
from convergent.studies.framework.units import UnitCache, run_jobs


def test_a_finished_unit_is_reused_and_only_it(tmp_path):
    calls = []

    def compute(seed):
        calls.append(seed)
        return {"accuracy": 0.5 + seed, "curve": [1.0, 0.5], "weights": torch.arange(3.0),
                "radius": math.inf}  # fmt: skip

    config = {"mode": "quick", "seeds": [0, 1], "lr": 1e-3}
    first = UnitCache(tmp_path, "toy", config)
    values = [first.run({"seed": s}, lambda s=s: compute(s)) for s in (0, 1)]
    assert calls == [0, 1] and first.misses == 2 and first.hits == 0
    # a new process with more seeds: seeds and mode do not enter the key
    again = UnitCache(tmp_path, "toy", {**config, "mode": "full", "seeds": [0, 1, 2]})
    reused = [again.run({"seed": s}, lambda s=s: compute(s)) for s in (0, 1, 2)]
    assert calls == [0, 1, 2] and again.hits == 2 and again.misses == 1
    assert reused[0]["accuracy"] == values[0]["accuracy"] and reused[1]["radius"] == math.inf
    assert torch.equal(reused[1]["weights"], torch.arange(3.0))
    assert "2 unit(s) reused" in again.summary()


def test_a_changed_config_design_or_number_never_reuses_a_unit(tmp_path, monkeypatch):
    config = {"mode": "quick", "seeds": [0], "lr": 1e-3}
    UnitCache(tmp_path, "toy", config).run({"seed": 0}, lambda: 1.0)
    changed = UnitCache(tmp_path, "toy", {**config, "lr": 2e-3})
    assert changed.get({"seed": 0}) is None
    other_study = UnitCache(tmp_path, "other", config)
    assert other_study.get({"seed": 0}) is None
    assert UnitCache(tmp_path, "toy", config, design=2).get({"seed": 0}) is None
    monkeypatch.setattr(units, "numerics_fingerprint", lambda: "other numbers")
    assert UnitCache(tmp_path, "toy", config).get({"seed": 0}) is None
    monkeypatch.undo()
    assert UnitCache(tmp_path, "toy", config).get({"seed": 0}) == 1.0


def test_a_unit_key_is_its_study_config_design_numbers_and_unit(tmp_path, monkeypatch):
    config = {"mode": "quick", "lr": 1e-3}
    key = UnitCache(tmp_path, "toy", config, design=2).key({"seed": 0})
    assert len(key) == 24 and int(key, 16) >= 0
    assert UnitCache(tmp_path / "other", "toy", dict(config), design=2).key({"seed": 0}) == key
    assert UnitCache(tmp_path, "toy", config, design=3).key({"seed": 0}) != key
    assert UnitCache(tmp_path, "toy", config, design=2).key({"seed": 1}) != key
    monkeypatch.setattr(units, "numerics_fingerprint", lambda: "0" * 16)
    assert UnitCache(tmp_path, "toy", config, design=2).key({"seed": 0}) != key
    monkeypatch.undo()
    assert UnitCache(tmp_path, "toy", config, design=2).key({"seed": 0}) == key


def test_disabled_cache_computes_everything_and_writes_nothing(tmp_path, monkeypatch):
    def no_canary() -> str:
        raise AssertionError("a disabled cache needs no fingerprint")

    monkeypatch.setattr(units, "numerics_fingerprint", no_canary)
    cache = UnitCache(tmp_path / "units", "toy", {}, enabled=False)
    assert cache.run({"seed": 0}, lambda: 3) == 3
    assert not (tmp_path / "units").exists()


def test_a_damaged_unit_file_is_recomputed(tmp_path):
    cache = UnitCache(tmp_path, "toy", {"lr": 1})
    cache.run({"seed": 0}, lambda: 1.0)
    cache.path({"seed": 0}).write_bytes(b"not a torch file")
    assert cache.run({"seed": 0}, lambda: 2.0) == 2.0
    assert UnitCache(tmp_path, "toy", {"lr": 1}).get({"seed": 0}) == 2.0


@dataclasses.dataclass(frozen=True)
class SquareJob:
    """A job for run_jobs: plain values, its own unit key."""

    value: int

    def unit(self) -> dict:
        return {"value": self.value}


def square(job: SquareJob) -> dict:
    return {"square": job.value**2, "pid": os.getpid()}


@pytest.mark.parametrize("workers", [1, 2])
def test_run_jobs_keeps_order_stores_each_unit_and_reuses_them(tmp_path, workers):
    cache = UnitCache(tmp_path, "demo", {"mode": "quick"})
    jobs = [SquareJob(v) for v in (3, 1, 2, 5)]
    lines: list[str] = []
    values = run_jobs(cache, jobs, square, workers=workers, log=lines.append)
    assert [v["square"] for v in values] == [9, 1, 4, 25]
    assert cache.misses == 4 and cache.hits == 0 and len(lines) == 4
    if workers == 2:  # computed in worker processes, not here
        assert all(v["pid"] != os.getpid() for v in values)
    again = UnitCache(tmp_path, "demo", {"mode": "quick"})
    assert run_jobs(again, [*jobs, SquareJob(4)], square, workers=workers) == [
        *values,
        again.get({"value": 4}),
    ]
    assert again.hits == 4 and again.misses == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killing_the_study_process_ends_its_workers(tmp_path):
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": str(root)}
    parent = subprocess.Popen(
        [sys.executable, "-m", "tests.studies.orphan_parent", str(tmp_path)],
        cwd=root,
        env=environment,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("worker-*.pid"))) < 2:
            assert time.monotonic() < deadline, "the workers never started"
            assert parent.poll() is None, "the study process ended early"
            time.sleep(0.2)
        workers = [int(path.read_text()) for path in tmp_path.glob("worker-*.pid")]
        parent.send_signal(signal.SIGKILL)  # no clean-up in the parent: the kernel must act
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, f"workers {workers} outlived their parent"
            time.sleep(0.2)
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.is_file() and status.read_text().split()[2] == "Z")  # zombie: ended


def test_a_folder_of_units_from_other_numbers_says_so_once(tmp_path, monkeypatch, caplog):
    # Units computed on another machine (another numbers' fingerprint) are never reused; the
    # first batch that finds none of the folder's files says why, naming both fingerprints.
    config = {"mode": "quick", "lr": 1e-3}
    monkeypatch.setattr(units, "numerics_fingerprint", lambda: "a" * 16)
    run_jobs(UnitCache(tmp_path, "toy", config), [SquareJob(0), SquareJob(1)], square)
    assert torch.load(next(tmp_path.glob("*.pt")), weights_only=True)["numerics"] == "a" * 16
    monkeypatch.setattr(units, "numerics_fingerprint", lambda: "b" * 16)
    cache = UnitCache(tmp_path, "toy", config)
    with caplog.at_level("WARNING", logger=units.__name__):
        run_jobs(cache, [SquareJob(0)], square)
        run_jobs(cache, [SquareJob(1)], square)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == (
        f"none of this run's units is among the 2 unit file(s) in {tmp_path}, which were "
        f"computed under numbers' fingerprint {'a' * 16} (another machine, or code that moved a "
        f"number), not this one's {'b' * 16}: its units are computed afresh"
    )
    # A folder whose units are found, an empty one, and one shared with another cache of this
    # machine's numbers (a pilot's regimes) say nothing.
    caplog.clear()
    with caplog.at_level("WARNING", logger=units.__name__):
        run_jobs(UnitCache(tmp_path, "toy", config), [SquareJob(0), SquareJob(5)], square)
        UnitCache(tmp_path / "empty", "toy", config).run({"seed": 0}, lambda: 1.0)
        run_jobs(UnitCache(tmp_path, "toy", {**config, "lr": 2e-3}), [SquareJob(0)], square)
    assert caplog.records == []


def test_units_computed_by_pool_workers_store_their_time(tmp_path):
    run_jobs(UnitCache(tmp_path, "toy", {"mode": "quick"}), [SquareJob(2), SquareJob(3)], square, 2)
    stored = [torch.load(path, weights_only=True) for path in tmp_path.glob("*.pt")]
    assert len(stored) == 2 and all(entry["seconds"] > 0 for entry in stored)


def test_reused_units_report_the_compute_time_they_stored(tmp_path, monkeypatch):
    # Each stored unit keeps the seconds its computation took; a later run that reuses it
    # sums them into its summary (units from before this field count as untimed).
    clock = iter([10.0, 13.5, 20.0, 21.25])
    monkeypatch.setattr(units.time, "perf_counter", lambda: next(clock))
    cache = UnitCache(tmp_path, "toy", {"mode": "quick"})
    run_jobs(cache, [SquareJob(2), SquareJob(3)], square)
    stored = sorted(torch.load(p, weights_only=True)["seconds"] for p in tmp_path.glob("*.pt"))
    assert stored == [1.25, 3.5]
    assert cache.summary().endswith(", 2 computed")
    old = UnitCache(tmp_path, "toy", {"mode": "quick"})
    old.put({"value": 4}, {"square": 16})  # no time, as before 2026-12-05
    again = UnitCache(tmp_path, "toy", {"mode": "quick"})
    run_jobs(again, [SquareJob(2), SquareJob(3), SquareJob(4)], square)
    assert again.hits == 3 and again.reused_timed == 2 and again.reused_seconds == 4.75
    assert again.summary().endswith(
        "3 unit(s) reused from " + str(tmp_path) + ", 0 computed; the reused units' compute "
        "time: 5 s (2 timed)"
    )
    one = UnitCache(tmp_path, "toy", {"mode": "quick"})
    assert one.run({"value": 2}, lambda: None)["square"] == 4
    assert one.hits == 1 and one.reused_seconds == 3.5  # the first unit: 10.0 -> 13.5
