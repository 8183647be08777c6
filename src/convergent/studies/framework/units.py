"""Resumable studies: each finished unit of work is kept on disk and reused on the next run.

A *unit* is one (configuration, seed) piece of a study, e.g. "HORST, lr 0.002, seed 1,
AC/DC to 90 %". :class:`UnitCache` stores what a unit returned in ``OUT/units/`` under a
key made of the study's name, its config (less the fields that only choose *which* units
run: ``mode``, ``seeds``, ``workers``, ``threads``), the unit's own description, the study's
declared unit design and the numbers' fingerprint (`canary.numerics_fingerprint`: a tiny
canary run through the library's numerical code, hashed). An interrupted run therefore loses
at most the unit in progress, a changed config or a change that moves a number never reuses a
stale unit, a refactor that moves none keeps every finished one, and adding seeds
(``--seeds 5`` after a 3-seed run) reuses the three finished ones. docs/design.md ("Unit
keys") says when a study must raise its design instead.

Values are whatever ``torch.save`` stores and ``torch.load(weights_only=True)`` reads back:
numbers, strings, lists, dicts and tensors. Each file is written atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from convergent.io import save_torch_atomically
from convergent.studies.framework.canary import numerics_fingerprint
from convergent.studies.framework.common import json_ready

Value = TypeVar("Value")


class Job(Protocol):
    """A unit of work that names its own unit-cache key."""

    def unit(self) -> Mapping[str, Any]: ...


JobType = TypeVar("JobType", bound=Job)

log = logging.getLogger(__name__)

# Fields that choose which units run, or how fast, but not what a unit computes.
SELECTION_FIELDS = ("mode", "seeds", "workers", "threads")


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    return repr(value)


class UnitCache:
    """Finished units of one study, kept in ``folder`` and keyed by config, design and numbers.

    Args:
        folder: where the unit files go (e.g. ``OUT/NAME/units``).
        study: the study's name.
        config: the study's config as a JSON-ready mapping.
        ignore: config fields left out of the key (see ``SELECTION_FIELDS``).
        enabled: False computes every unit and stores nothing.
        design: the study's unit design (1 at first), a constant the study declares and
            raises when its own code (data handling, model building, what a unit records)
            would compute other numbers for the same config; the library's numbers are
            covered by `numerics_fingerprint`.
    """

    def __init__(
        self,
        folder: str | Path,
        study: str,
        config: Mapping[str, Any],
        ignore: Iterable[str] = SELECTION_FIELDS,
        enabled: bool = True,
        *,
        design: int = 1,
    ) -> None:
        self.folder = Path(folder)
        self.enabled = enabled
        skipped = set(ignore)
        self._base = {
            "study": study,
            "config": _canonical({k: v for k, v in config.items() if k not in skipped}),
            "design": design,
        }
        self.hits = 0
        self.misses = 0
        # What the reused units took when they were computed (files written since
        # 2026-12-05 store it): the sum and how many of them stored a time.
        self.reused_seconds = 0.0
        self.reused_timed = 0
        self._looked = False

    def key(self, unit: Mapping[str, Any], numerics: str | None = None) -> str:
        """The file stem of ``unit``: a hash of the study, config, design, numbers (this
        process's `numerics_fingerprint`, or ``numerics``) and unit."""
        # The fingerprint is computed at the first key (once per process), not for a cache
        # that is never asked.
        fingerprint = numerics_fingerprint() if numerics is None else numerics
        key = {**self._base, "numerics": fingerprint, "unit": _canonical(unit)}
        text = json.dumps(key, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def path(self, unit: Mapping[str, Any]) -> Path:
        return self.folder / f"{self.key(unit)}.pt"

    def get(self, unit: Mapping[str, Any]) -> Any | None:
        """The stored value of ``unit``, or None when it has not finished before."""
        stored = self._stored(unit)
        return None if stored is None else stored["value"]

    def _stored(self, unit: Mapping[str, Any]) -> dict[str, Any] | None:
        """The whole stored entry of ``unit`` (value, and the fingerprint and seconds where
        it kept them), or None."""
        if not self.enabled:
            return None
        path = self.path(unit)
        if not path.is_file():
            return None
        try:
            stored = torch.load(path, weights_only=True)
        except Exception as error:  # a file from an older torch, or damaged: recompute
            log.warning("unit file %s unreadable (%s); recomputing it", path, error)
            return None
        return stored

    def _reuse(self, unit: Mapping[str, Any]) -> Any | None:
        """`get`, counting a found unit as a hit with the compute time it stored."""
        stored = self._stored(unit)
        if stored is None:
            return None
        self.hits += 1
        if stored.get("seconds") is not None:
            self.reused_seconds += float(stored["seconds"])
            self.reused_timed += 1
        return stored["value"]

    def _warn_if_foreign(self, jobs_found: int) -> None:
        foreign = self.foreign_files(jobs_found)
        if foreign is not None:
            log.warning(foreign)

    def put(self, unit: Mapping[str, Any], value: Any, seconds: float | None = None) -> None:
        """Store ``value`` for ``unit`` (atomically), with the ``seconds`` it took."""
        if not self.enabled:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        # The fingerprint and the compute time ride along (no key reads them): files computed
        # elsewhere say under which numbers they were, and a run that reuses them what they
        # cost (`summary`).
        stored = {"unit": _canonical(unit), "value": value, "numerics": numerics_fingerprint()}
        if seconds is not None:
            stored["seconds"] = float(seconds)
        save_torch_atomically(stored, self.path(unit))

    def foreign_files(self, jobs_found: int) -> str | None:
        """Once per cache: where the first batch asked of it found none of its units
        (``jobs_found`` is 0) and its folder holds unit files computed under another numbers'
        fingerprint (another machine, or code that moved a number; the smallest file read),
        a sentence saying so; else None (several caches may share a folder: files of this
        machine's numbers are theirs, and files from before 2026-12-05 store no fingerprint)."""
        if self._looked or not self.enabled:
            return None
        self._looked = True
        if jobs_found or self.hits:
            return None
        files = sorted(self.folder.glob("*.pt"), key=lambda path: path.stat().st_size)
        if not files:
            return None
        try:
            fingerprint = torch.load(files[0], weights_only=True).get("numerics")
        except Exception:  # a damaged file says nothing
            return None
        here = numerics_fingerprint()
        if fingerprint is None or fingerprint == here:
            return None
        return (
            f"none of this run's units is among the {len(files)} unit file(s) in {self.folder}, "
            f"which were computed under numbers' fingerprint {fingerprint} (another machine, or "
            f"code that moved a number), not this one's {here}: its units are computed afresh"
        )

    def run(self, unit: Mapping[str, Any], compute: Callable[[], Value]) -> Value:
        """The stored value of ``unit`` if it finished before, else ``compute()``, stored."""
        stored = self._reuse(unit)
        if stored is not None:
            return stored
        self._warn_if_foreign(0)
        self.misses += 1
        value, seconds = _timed(compute)
        self.put(unit, value, seconds)
        return value

    def count_in(self, other: UnitCache) -> None:
        """Count ``other``'s units (reused, computed, their stored time) in this cache's
        `summary`: a part whose units are keyed by its own settings keeps them in a cache of
        its own beside the study's, and the run's note counts every unit it read or made."""
        self.hits += other.hits
        self.misses += other.misses
        self.reused_seconds += other.reused_seconds
        self.reused_timed += other.reused_timed

    def summary(self) -> str:
        """``"3 unit(s) reused from F, 5 computed"`` for the report, with what the reused
        units took when computed where they stored it ("; the reused units' compute time:
        812 s (3 timed)")."""
        text = f"{self.hits} unit(s) reused from {self.folder}, {self.misses} computed"
        if self.reused_timed:
            text += (
                f"; the reused units' compute time: {self.reused_seconds:.0f} s "
                f"({self.reused_timed} timed)"
            )
        return text


def _timed(compute: Callable[..., Value], *arguments: Any) -> tuple[Value, float]:
    """``compute(*arguments)`` and the wall seconds it took (top-level: a pool runs it)."""
    started = time.perf_counter()
    value = compute(*arguments)
    return value, time.perf_counter() - started


def _end_with_parent(parent: int) -> None:
    """Worker start-up: a worker ends when the study process that started it dies.

    Without this, killing ``convergent reproduce`` leaves its spawned workers computing units
    that nobody will store, on every core, until they finish. Linux delivers SIGTERM to the
    worker when its parent dies (``PR_SET_PDEATHSIG``); elsewhere nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    set_parent_death_signal = 1  # PR_SET_PDEATHSIG in <linux/prctl.h>
    ctypes.CDLL(None).prctl(set_parent_death_signal, int(signal.SIGTERM))
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def run_jobs(
    cache: UnitCache,
    jobs: Sequence[JobType],
    compute: Callable[[JobType], Value],
    workers: int = 1,
    log: Callable[[str], None] | None = None,
) -> list[Value]:
    """Each job's value, from ``cache`` or computed, in the order of ``jobs``.

    With ``workers`` > 1 the pending jobs run in that many processes (``compute`` must be a
    top-level function and the jobs plain values); the parent stores each unit the moment it
    finishes, so an interruption loses only the jobs in flight. Jobs are deterministic:
    processes change the wall time, not the values.
    """
    values: list[Any] = [cache._reuse(job.unit()) for job in jobs]
    cache._warn_if_foreign(sum(value is not None for value in values))
    pending = [index for index, value in enumerate(values) if value is None]
    done = 0

    def store(index: int, value: Any, seconds: float) -> None:
        nonlocal done
        cache.put(jobs[index].unit(), value, seconds)
        cache.misses += 1
        values[index] = value
        done += 1
        if log is not None:
            log(f"{done}/{len(pending)} computed: {_canonical(jobs[index].unit())}")

    if workers > 1 and len(pending) > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_end_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = {pool.submit(_timed, compute, jobs[index]): index for index in pending}
            for future in as_completed(futures):
                store(futures[future], *future.result())
    else:
        for index in pending:
            store(index, *_timed(compute, jobs[index]))
    return values


@contextlib.contextmanager
def unit_session(
    study: str, config: Any, out_dir: str | Path, threads: int, progress: bool, *, design: int
) -> Iterator[tuple[Path, Callable[[str], None], UnitCache]]:
    """The setting of a study run on units: its folder (created), a logger printing
    ``[study] line`` when ``progress`` is on, and its :class:`UnitCache` in ``folder/units``
    (keyed with the study's unit ``design``); torch runs ``threads`` threads in this process
    until the block ends."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        if progress:
            print(f"[{study}] {line}", flush=True)

    cache = UnitCache(folder / "units", study, json_ready(config), design=design)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield folder, log, cache
    finally:
        torch.set_num_threads(previous)
