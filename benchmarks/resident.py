"""Peak resident memory of this process while a block of code runs (Linux), for the benchmarks
that report memory: `oneshot_pruning.py` and the llm-compressor comparison (whose worker runs
in llm-compressor's own environment, so this module imports nothing but the standard library)."""

from __future__ import annotations

import os
import threading

PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def resident_mib() -> float:
    """This process's resident memory in MiB (Linux)."""
    with open("/proc/self/statm") as statm:  # size, resident, ... in pages
        return int(statm.read().split()[1]) * PAGE_MIB


class PeakResident:
    """The largest resident memory while the block runs, sampled every millisecond by a
    thread (the process's own high-water mark would include the loading)."""

    def __enter__(self) -> PeakResident:
        self.start = self.peak = resident_mib()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, resident_mib())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, resident_mib())

    @property
    def above_start(self) -> float:
        return self.peak - self.start
