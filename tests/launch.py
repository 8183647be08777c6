"""Run a test worker module under ``torchrun`` (gloo, one machine) from a test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torchrun(module: str, *arguments: str, processes: int) -> str:
    """Launch ``python -m module arguments`` on ``processes`` local ranks; fail with stderr.

    Returns:
        What the ranks printed (stdout).
    """
    # The checkout's own code (src), not whichever install the interpreter finds first, and
    # the tests' worker modules (ROOT).
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    environment = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        module,
        *arguments,
    ]
    completed = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout
