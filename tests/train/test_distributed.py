from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, processes: int) -> dict:
    output = tmp_path / f"result-{processes}.pt"
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "tests.train.ddp_worker",
        str(output),
    ]
    completed = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return torch.load(output, weights_only=True)


@pytest.mark.distributed
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path):
    one = _run(tmp_path, 1)
    two = _run(tmp_path, 2)
    for name, value in one["state"].items():
        torch.testing.assert_close(two["state"][name], value, rtol=1e-5, atol=1e-6)
    assert one["evaluation"]["accuracy"] == pytest.approx(two["evaluation"]["accuracy"])
    assert one["evaluation"]["loss"] == pytest.approx(two["evaluation"]["loss"], rel=1e-5)
