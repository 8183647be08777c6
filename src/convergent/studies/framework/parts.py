"""Running one part of a study and adding what it measured to a written ``results.json``.

A full run of a study that trains on several data sets takes hours, and its units are reused
only under the numbers' fingerprint that computed them (docs/design.md, "Unit keys"). When a
design adds a part, a machine of another kind cannot rerun the finished parts cheaply; it runs
the new part alone (``convergent reproduce NAME --full --part P``) and adds it to the committed
results. A study offers this by satisfying :class:`PartedStudy`: it names the parts that run
alone and measures and reports each one; this module checks that the written results are
of the same study, mode, config and design, merges the part's data, tuning, tables and
figures into them, re-scores every claim from the merged form (as a rescore does) and
records the part's units and wall time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from convergent.studies.framework.common import StudyResult, json_ready
from convergent.studies.framework.readme import UNITS_NOTE
from convergent.studies.framework.study import Measured, Report, Session, Study
from convergent.studies.framework.units import unit_session


class PartRefused(ValueError):
    """A part that cannot be run alone or added to the results named (the message says why)."""


@runtime_checkable
class PartedStudy(Study, Protocol):
    """A study some of whose parts can run alone and be added to its written results.

    Attributes:
        parts: ``{part: what it measures}``, the parts that run alone (a part whose report
            needs another part's unsaved objects is not one of them).
    """

    parts: Mapping[str, str]

    def measure_part(self, config: Any, part: str, session: Session) -> Measured:
        """Run ``part`` alone; its top-level ``data`` keys and ``tuning`` experiments replace
        those of the same name in the written results."""
        ...

    def report_part(self, config: Any, part: str, measured: Measured, folder: Path) -> Report:
        """``part``'s tables and figures (drawn into ``folder``), and the study's notes, all
        from ``measured``: the merged results' ``data`` and ``tuning`` (in their stored form)
        and the part's ``unsaved`` objects."""
        ...


def parts_of(study: Study) -> Mapping[str, str]:
    """The parts of ``study`` that run alone (none for a study that is not parted)."""
    return study.parts if isinstance(study, PartedStudy) else {}


def check_part(study: Study, part: str) -> PartedStudy:
    """``study``, if ``part`` is one of its parts that run alone; else :class:`PartRefused`
    naming ``part`` and those parts."""
    parts = parts_of(study)
    if not isinstance(study, PartedStudy) or part not in parts:
        offered = ", ".join(f"{name} ({what})" for name, what in parts.items()) or "none"
        raise PartRefused(
            f"study {study.name} has no part {part!r} that runs alone; its parts that do: {offered}"
        )
    return study


def written_results(study: Study, config: Any, folder: Path) -> dict[str, Any]:
    """The ``results.json`` in ``folder`` that a part of ``study`` at ``config`` may be added to:
    the same study, mode, config and claims' design, or :class:`PartRefused` saying which
    differs."""
    path = folder / "results.json"
    if not path.is_file():
        raise PartRefused(
            f"{path} does not exist: a part is added to a written run of the whole study "
            f"(convergent reproduce {study.name} --{config.mode}), so run that first"
        )
    payload: dict[str, Any] = json.loads(path.read_text())
    stored, current = payload.get("config", {}), json_ready(config)
    differing = sorted(k for k in {*stored, *current} if stored.get(k) != current.get(k))
    found = {
        "study": (payload.get("name"), study.name),
        "mode": (payload.get("mode"), config.mode),
        "claims' design": (payload.get("data", {}).get("design"), study.design),
    }
    for what, (written, running) in found.items():
        if written != running:
            raise PartRefused(
                f"{path} holds {what} {written!r}, but this run's {what} is {running!r}; a part "
                "is added only to results of the same study, mode and design"
            )
    if differing:
        raise PartRefused(
            f"{path} was run with another config ({', '.join(differing)} differ from this "
            "run's); a part is added only to results of the same config"
        )
    return payload


def run_part(
    study: Study,
    config: Any,
    part: str,
    out_dir: str | Path,
    onto: str | Path,
    progress: bool = True,
) -> StudyResult:
    """Run ``part`` of ``study`` at ``config`` (its units resumed from ``out_dir / "units"``)
    and add it to the results written in ``onto``; the part's figures are drawn into ``onto``.
    The caller writes the returned result there.

    Every claim is re-scored from the merged stored form; the tables and figures the part
    reports replace those of the same name (others are appended), the notes are the study's
    for the merged results, followed by the earlier run's unit notes and the part's, and the
    run time is the earlier run's plus the part's.
    """
    parted = check_part(study, part)
    onto = Path(onto)
    payload = written_results(study, config, onto)
    started = time.perf_counter()
    with unit_session(
        study.name, config, out_dir, study.threads(config), progress, design=study.unit_design
    ) as (_, log, cache):
        measured = parted.measure_part(config, part, Session(onto, log, cache))
    data = {**payload["data"], **json_ready(measured.data)}
    tuning = {**payload.get("tuning", {}), **json_ready(measured.tuning)}
    claims = study.claims_from_results({"config": json_ready(config), "data": data})
    merged = Measured(data=data, tuning=tuning, unsaved=measured.unsaved)
    report: Report = parted.report_part(config, part, merged, onto)
    figures = list(payload.get("figures", []))
    figures += [name for name in report.figures if name not in figures]
    # The earlier runs' unit notes, less one this part left in an earlier run alone (its units
    # are this run's now, and would be counted twice).
    alone = f"Part ({part}) alone: "
    earlier_units = [
        note
        for note in payload.get("notes", [])
        if UNITS_NOTE.search(note) and not note.startswith(alone)
    ]
    return StudyResult(
        name=study.name,
        mode=config.mode,
        config=config,
        tables={**payload.get("tables", {}), **report.tables},
        claims=list(claims),
        figures=figures,
        data=data,
        notes=[*report.notes, *earlier_units, f"{alone}{cache.summary()}."],
        seconds=float(payload.get("seconds", 0.0)) + time.perf_counter() - started,
        tuning=tuning,
    )
