"""The Study protocol, and the run the framework owns around it.

A study supplies its configuration, its parts (what to train and measure, as units of the
resumable cache) and its claims; this module owns everything around them, in one order for
every study: the unit session (folder, progress log, :class:`~.units.UnitCache`, torch's
threads), the claims' design stamped into the data, the claims scored from the stored (JSON)
form by the very function that re-scores a committed ``results.json``, the study's tables,
figures and notes, and the finished :class:`~.common.StudyResult` (with the cache's summary
and the wall time). Seeds, the report files and the README block are the package's
(:mod:`convergent.studies`): ``study_config``, ``run_study``, ``rescore``.

As torchtune's recipes follow one ``Protocol``, each study is a class that inherits nothing
and satisfies :class:`Study` by its shape; a study with a pilot also satisfies
:class:`PilotedStudy`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from convergent.studies.framework.advice import Advice
from convergent.studies.framework.claims import Claim
from convergent.studies.framework.common import StudyResult, finish, json_ready
from convergent.studies.framework.summary import Sentence
from convergent.studies.framework.units import UnitCache, unit_session


@dataclass(frozen=True)
class Session:
    """Where a study's parts run: its folder (figures go there), the progress log and the
    unit cache every unit goes through."""

    folder: Path
    log: Callable[[str], None]
    cache: UnitCache


@dataclass
class Measured:
    """What a study's parts measured.

    Attributes:
        data: every number ``results.json`` keeps (the framework adds the claims' ``design``
            first), in the form the claims read once made JSON.
        tuning: ``{experiment: {method: Tuning.to_json()}}``, the grid searches behind the
            selected hyperparameters (none for a study that selects otherwise).
        unsaved: what the report draws from but ``results.json`` does not keep (weight
            histograms, the runs as objects).
    """

    data: dict[str, Any]
    tuning: dict[str, Any] = field(default_factory=dict)
    unsaved: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """A study's report parts: named tables (lists of row dicts), the PNG files it drew
    (relative to its folder) and its notes."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@runtime_checkable
class Study(Protocol):
    """What one study supplies to the framework.

    Attributes:
        name: the study's name (``convergent reproduce NAME``, its report folder).
        design: the claims' design: the tests `claims_from_results` scores, stamped into
            the data so a rescore knows which tests the runs had.
        unit_design: the design of the study's units: raised when its own code would compute
            other numbers for the same config (the library's numbers are fingerprinted:
            docs/design.md, "Unit keys").
        families: the study's parts by claim-key prefix, each one family of claims tested
            together (Holm's adjustment, :mod:`.family`); `claims_from_results` applies it.
    """

    name: str
    design: int
    unit_design: int
    families: Mapping[str, str]

    def config(self, mode: str) -> Any:
        """The frozen config at ``mode`` size (``smoke``, ``quick`` or ``full``); it has
        ``mode`` and ``seeds`` fields."""
        ...

    def reserved_seeds(self, config: Any) -> Collection[int]:
        """The seeds the study tunes or pilots with, which final runs must never share."""
        ...

    def threads(self, config: Any) -> int:
        """How many threads torch runs in this process while the parts run."""
        ...

    def measure(self, config: Any, session: Session) -> Measured:
        """Run every part (each run a unit of ``session.cache``) and return what they
        measured."""
        ...

    def claims_from_results(self, results: Mapping[str, Any]) -> list[Claim]:
        """The claims scored from a ``results.json`` payload alone (``config``, ``data``)."""
        ...

    def report(self, config: Any, measured: Measured, folder: Path) -> Report:
        """The tables, notes and figures (drawn into ``folder``) of what was measured."""
        ...

    def summary(self, results: Mapping[str, Any]) -> list[Sentence]:
        """The plain sentences that open the report, from a ``results.json`` payload."""
        ...

    def brief(self, results: Mapping[str, Any]) -> list[Sentence]:
        """The README's summary of a ``results.json`` payload: about 100 words, action first,
        no numbers (they are in the tables)."""
        ...

    def advice(self, results: Mapping[str, Any]) -> list[Advice]:
        """The study's rows of the README's "What to use" table, from a ``results.json``
        payload."""
        ...


@runtime_checkable
class PilotedStudy(Study, Protocol):
    """A study with a pilot (``convergent reproduce NAME --pilot``): validation runs that
    chose its design, written beside its report, never read by its final runs."""

    def run_pilot(self, out_dir: str | Path, *, log: Callable[[str], None]) -> dict[str, Any]:
        """Run (or resume, from ``out_dir/units``) the pilot; the result has ``chosen``
        and ``used``."""
        ...


def run_config(
    study: Study, config: Any, out_dir: str | Path, progress: bool = True
) -> StudyResult:
    """Run ``study`` at ``config`` (resuming from ``out_dir / "units"``), score its claims and
    draw its figures into ``out_dir``; the caller writes ``report.md`` and ``results.json``.

    Args:
        study: the study.
        config: its config (`Study.config`, possibly with other seeds).
        out_dir: the study's folder.
        progress: print progress.
    """
    started = time.perf_counter()
    with unit_session(
        study.name,
        config,
        out_dir,
        study.threads(config),
        progress,
        design=study.unit_design,
    ) as (folder, log, cache):
        measured = study.measure(config, Session(folder, log, cache))
    log(cache.summary())
    measured.data = {"design": study.design, **measured.data}
    # New runs are scored from the stored form, by the function that re-scores a results.json.
    claims = study.claims_from_results(
        {"config": json_ready(config), "data": json_ready(measured.data)}
    )
    report = study.report(config, measured, folder)
    return finish(
        study.name,
        config,
        started,
        cache.summary(),
        claims=claims,
        data=measured.data,
        tables=report.tables,
        figures=report.figures,
        notes=report.notes,
        tuning=measured.tuning,
    )
