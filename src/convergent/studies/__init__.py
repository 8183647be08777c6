"""Studies: one package per pillar, each reproducing its paper's claim at small scale.

Each study package exposes ``STUDY``, an object of the
:class:`~convergent.studies.framework.Study` protocol: its configuration, its parts (what to
train and measure) and its claims. The framework owns the run (`run_config`); this module
names the studies, picks their seeds (`study_config`) and writes their reports
(`run_study`, `rescore`). Packages are imported only when a study runs, so that
``import convergent`` stays light.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from convergent.studies.framework import (
    MODES,
    VERDICTS,
    Check,
    Claim,
    Study,
    StudyResult,
    Threshold,
    check_mode,
    claim_from_seeds,
    json_ready,
    load_study,
    render_markdown,
    results_payload,
    run_config,
    run_part,
    write_study,
)
from convergent.studies.framework.advice import Advice
from convergent.studies.framework.designs import OtherDesign
from convergent.studies.framework.family import family_tested_records
from convergent.studies.framework.history import earlier_designs, history_lines
from convergent.studies.framework.summary import Sentence

# name -> package, whose ``STUDY`` is the study; a study is listed here once it exists.
STUDIES: dict[str, str] = {
    "descent": "convergent.studies.descent",
    "langevin": "convergent.studies.langevin",
    "residual": "convergent.studies.residual",
    "sparsity": "convergent.studies.sparsity",
}


def get_study(name: str) -> Study:
    """Study ``name`` (its package's ``STUDY``; one with a pilot is also a
    :class:`~convergent.studies.framework.PilotedStudy`); raises a ValueError listing the
    known studies."""
    if name not in STUDIES:
        known = ", ".join(sorted(STUDIES)) or "none yet"
        raise ValueError(f"unknown study {name!r}; the studies are: {known}")
    study: Study = importlib.import_module(STUDIES[name]).STUDY
    return study


def study_config(name: str, mode: str, seeds: int | None = None) -> object:
    """Study ``name``'s config at ``mode`` size, with ``seeds`` final seeds when given: the
    mode's own final seeds, cut to the first ``seeds`` or continued upward past the last one,
    skipping the seeds the study tunes or pilots with (`Study.reserved_seeds`), which the final
    runs must not share. The
    mode's own seeds come first, so a larger ``seeds`` reuses the finished units of a run at the
    mode's default and adds new seeds to them."""
    check_mode(mode)
    study = get_study(name)
    config = study.config(mode)
    if seeds is not None:
        if seeds < 1:
            raise ValueError(f"seeds must be a positive integer, got {seeds}")
        reserved = set(study.reserved_seeds(config))
        chosen = [seed for seed in config.seeds if seed not in reserved][:seeds]
        candidate = max(config.seeds) + 1
        while len(chosen) < seeds:
            if candidate not in reserved:
                chosen.append(candidate)
            candidate += 1
        config = dataclasses.replace(config, seeds=tuple(chosen))
    return config


def _sentences(payload: Mapping[str, Any], writer: str) -> list[Sentence]:
    """The sentences of the study's ``writer`` (``brief`` or ``summary``) for a
    ``results.json`` payload. Where the verdicts are exploratory (the current tests on an
    earlier design's data), a first sentence says so; results of a design the code no longer
    scores get one sentence saying whose they are."""
    study = get_study(payload["name"])
    try:
        study.claims_from_results(payload)
    except OtherDesign as refused:
        return [Sentence(superseded_sentence(refused))]
    write = study.brief if writer == "brief" else study.summary
    sentences = list(write(payload))
    if sentences and any(claim.get("exploratory") for claim in payload["claims"]):
        sentences.insert(0, Sentence(EXPLORATORY_SENTENCE))
    return sentences


def study_summary(payload: Mapping[str, Any]) -> list[Sentence]:
    """The README's summary of a study's results (``results.json``): its study's
    ``brief(payload)``, about 100 words, action first, no numbers (they are in the tables)."""
    return _sentences(payload, "brief")


def study_findings(payload: Mapping[str, Any]) -> list[Sentence]:
    """The sentences opening a study's report: its study's ``summary(payload)``, every
    finding with its numbers."""
    return _sentences(payload, "summary")


def study_advice(payload: Mapping[str, Any]) -> list[Advice]:
    """A study's rows of the README's "What to use" table: its study's ``advice(payload)``;
    none for results of a design its code no longer scores."""
    study = get_study(payload["name"])
    try:
        study.claims_from_results(payload)
    except OtherDesign:
        return []
    return list(study.advice(payload))


def superseded_sentence(refused: OtherDesign) -> str:
    """The summary of results whose design the study's code no longer scores."""
    return (
        f"These are design {refused.found}'s results, with the verdicts it was scored with; "
        f"the study's current design, {refused.current}, is declared, and until its full run "
        f"is committed the verdicts below are design {refused.found}'s."
    )


EXPLORATORY_SENTENCE = (
    "These verdicts are exploratory: the study's current tests, revised after an audit of "
    "these numbers, scored on the seeds the previous design ran; a run on new seeds confirms "
    "or overturns them."
)


def design_history(folder: str | Path, payload: Mapping[str, Any]) -> list[str]:
    """The report's "Verdicts across designs" lines for the study written in ``folder``
    (none when ``folder`` has no ``history/`` of earlier designs)."""
    earlier = earlier_designs(folder)
    if not earlier:
        return []
    study = get_study(payload["name"])
    # Earlier designs' verdicts as scored then, with the family test their claims carry now
    # (a kept earlier scoring, "scored_as", stays exactly as it was).
    earlier = [
        (
            number,
            old
            if "scored_as" in old
            else {
                **old,
                "claims": family_tested_records(old["claims"], study.families),
                "scored_as": "as scored then, Holm's adjustment over its parts added now",
            },
        )
        for number, old in earlier
    ]

    def rescored(old: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [claim.to_json() for claim in study.claims_from_results(old)]

    return history_lines(payload, study.design, earlier, rescored)


def _write(result: StudyResult, folder: Path) -> None:
    """Write ``result``'s report and results into ``folder``, with its summary and history."""
    payload = results_payload(result)
    summary = [sentence.text for sentence in study_findings(payload)]
    write_study(result, folder, summary, design_history(folder, payload))


def run_study(
    name: str, mode: str, out_dir: str | Path, progress: bool = True, seeds: int | None = None
) -> StudyResult:
    """Run study ``name`` at ``mode`` size and write its report into ``out_dir / name``.

    Args:
        name: the study.
        mode: ``smoke``, ``quick`` or ``full``.
        out_dir: reports go into ``out_dir / name``; finished units are kept in its
            ``units/`` folder, so an interrupted run resumes where it stopped.
        progress: print progress.
        seeds: run this many final seeds instead of the mode's own (see ``study_config``).
    """
    config = study_config(name, mode, seeds)
    folder = Path(out_dir) / name
    result = run_config(get_study(name), config, folder, progress=progress)
    _write(result, folder)
    return result


def run_study_part(
    name: str,
    mode: str,
    part: str,
    out_dir: str | Path,
    onto: str | Path | None = None,
    progress: bool = True,
    seeds: int | None = None,
) -> StudyResult:
    """Run part ``part`` of study ``name`` alone at ``mode`` size (units in
    ``out_dir / name / "units"``, resumable) and add it to the study's results written in
    ``onto`` (default ``out_dir / name``), rewriting the report there with every claim
    re-scored (:func:`~convergent.studies.framework.run_part`)."""
    config = study_config(name, mode, seeds)
    folder = Path(out_dir) / name
    target = folder if onto is None else Path(onto)
    result = run_part(get_study(name), config, part, folder, target, progress=progress)
    _write(result, target)
    return result


def rescore(folder: str | Path) -> StudyResult:
    """Re-score a written study's claims from its ``results.json`` and rewrite its report.

    Only the claims change: every measured number stays as it was written.
    """
    result = load_study(folder)
    result.claims = list(get_study(result.name).claims_from_results(results_payload(result)))
    _write(result, Path(folder))
    return result


def write_index(results: list[StudyResult], out_dir: str | Path) -> Path:
    """A ``README.md`` over several studies: each claim's verdict, linking each report."""
    lines = [
        "# Studies",
        "",
        "| study | mode | claim | verdict | effect (95 % interval, n) |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        link = f"[{result.name}]({result.name}/report.md)"
        for claim in result.claims:
            lines.append(
                f"| {link} | {result.mode} | {claim.statement} | {claim.label} | "
                f"{claim.summary()} |"
            )
    index = Path(out_dir) / "README.md"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text("\n".join(lines) + "\n")
    return index


__all__ = [
    "EXPLORATORY_SENTENCE",
    "MODES",
    "STUDIES",
    "VERDICTS",
    "Check",
    "Claim",
    "Study",
    "StudyResult",
    "Threshold",
    "check_mode",
    "claim_from_seeds",
    "design_history",
    "get_study",
    "json_ready",
    "load_study",
    "render_markdown",
    "rescore",
    "run_config",
    "run_study",
    "run_study_part",
    "study_advice",
    "study_config",
    "study_findings",
    "study_summary",
    "write_index",
    "write_study",
]
