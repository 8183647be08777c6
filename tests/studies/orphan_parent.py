"""Run by a test: a study process whose two unit workers record their pids, then sleep."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from convergent.studies.framework import units
from convergent.studies.framework.units import UnitCache, run_jobs


@dataclass(frozen=True)
class SleepJob:
    folder: str
    index: int

    def unit(self) -> dict[str, int]:
        return {"index": self.index}


def sleep_unit(job: SleepJob) -> int:
    Path(job.folder, f"worker-{job.index}.pid").write_text(str(os.getpid()))
    time.sleep(120)
    return job.index


if __name__ == "__main__":
    # The units' keys need the numbers' fingerprint, which a fresh interpreter computes (3 s of
    # CPU); what this process is for is its workers, so any fixed fingerprint serves.
    units.numerics_fingerprint = lambda: "0" * 16
    folder = sys.argv[1]
    cache = UnitCache(Path(folder) / "units", "orphans", {})
    run_jobs(cache, [SleepJob(folder, 0), SleepJob(folder, 1)], sleep_unit, workers=2)
