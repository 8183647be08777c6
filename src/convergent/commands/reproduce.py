"""``convergent reproduce``: run studies (or one study's regime pilot) and say what each found.

Every call into a study goes through :func:`run_one_study` or :func:`pilot_of`, so that a
change of the studies' entry point is an edit here and nowhere else. Which studies exist,
and which have a pilot, is read from the studies' registry (``convergent.studies.STUDIES``),
never listed here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convergent.commands.flags import UserError


def run_one_study(name: str, mode: str, out: Path, progress: bool, seeds: int | None) -> Any:
    """Run study ``name`` at ``mode`` size into ``out / name``; its ``StudyResult``."""
    from convergent.studies import run_study

    return run_study(name, mode, out, progress=progress, seeds=seeds)


def pilot_of(name: str) -> Callable[..., dict[str, Any]] | None:
    """Study ``name``'s regime pilot, ``pilot(folder, log=...) -> result``; None if it has
    none."""
    from convergent.studies import get_study
    from convergent.studies.framework import PilotedStudy

    study = get_study(name)
    return study.run_pilot if isinstance(study, PilotedStudy) else None


def piloted_studies() -> list[str]:
    """The studies that have a regime pilot, in name order."""
    from convergent.studies import STUDIES

    return [name for name in sorted(STUDIES) if pilot_of(name) is not None]


def alone_parts() -> list[tuple[str, str, str]]:
    """``(study, part, what it measures)`` for every part a study runs alone."""
    from convergent.studies import STUDIES, get_study
    from convergent.studies.framework import parts_of

    return [
        (name, part, what)
        for name in sorted(STUDIES)
        for part, what in parts_of(get_study(name)).items()
    ]


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``reproduce`` and its flags to ``commands``."""
    from convergent.studies import MODES, STUDIES

    parser = commands.add_parser(
        "reproduce",
        help="run a paper-reproduction study (or all of them) and write its report",
        description="Run studies: " + ", ".join(sorted(STUDIES)) + ". Each writes report.md, "
        "results.json and PNG figures under OUT/NAME.",
    )
    parser.add_argument("names", nargs="+", metavar="STUDY", help="study names, or 'all'")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--mode",
        choices=MODES,
        default="quick",
        help="how big a study runs: smoke (seconds: it runs), quick (minutes, one seed) or full"
        " (hours) (default quick)",
    )
    for mode in MODES:
        size.add_argument(
            f"--{mode}",
            dest="mode",
            action="store_const",
            const=mode,
            help=f"same as --mode {mode}",
        )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/studies"),
        help="where reports go: OUT/NAME (default runs/studies)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="run N final seeds: the mode's own, cut or continued upward (skipping the seeds a "
        "study tunes with), so a larger N reuses a finished run's units",
    )
    parser.add_argument(
        "--part",
        default=None,
        metavar="P",
        help="run one part of one study alone and add it to that study's written results "
        "(same mode and config), re-scoring every claim: "
        + "; ".join(f"{name} {p} ({what})" for name, p, what in alone_parts()),
    )
    parser.add_argument(
        "--onto",
        type=Path,
        default=None,
        metavar="FOLDER",
        help="with --part: the folder of the written results the part is added to, and where "
        "its report is rewritten (default OUT/NAME; the part's units stay in OUT/NAME/units)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--pilot",
        action="store_true",
        help="run (or resume) the study's regime pilot on the validation split instead ("
        + ", ".join(piloted_studies())
        + "), writing OUT/NAME-pilot/pilot.json",
    )
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    """``convergent reproduce``'s parsed flags: run the studies named, or the pilot."""
    names = study_names(arguments.names)
    if arguments.seeds is not None and arguments.seeds < 1:
        raise UserError(f"--seeds must be a positive integer, got {arguments.seeds}")
    if arguments.onto is not None and arguments.part is None:
        raise UserError("--onto names where a part goes; give the part with --part")
    if arguments.pilot:
        if arguments.part is not None:
            raise UserError("--pilot and --part are different runs; give one of them")
        run_pilot(names, arguments.out, progress=not arguments.no_progress)
    elif arguments.part is not None:
        reproduce_part(
            names,
            arguments.part,
            arguments.mode,
            arguments.out,
            arguments.onto,
            progress=not arguments.no_progress,
            seeds=arguments.seeds,
        )
    else:
        reproduce(
            names,
            arguments.mode,
            arguments.out,
            progress=not arguments.no_progress,
            seeds=arguments.seeds,
        )
    return 0


def study_names(given: list[str]) -> list[str]:
    """The studies ``given`` names (``["all"]``: every study), each checked to exist."""
    from convergent.studies import STUDIES

    names = sorted(STUDIES) if given == ["all"] else list(given)
    for name in names:
        if name not in STUDIES:
            from convergent.wording import did_you_mean

            raise UserError(
                f"unknown study {name!r}{did_you_mean(name, [*STUDIES, 'all'])}; the studies are:"
                f" {', '.join(sorted(STUDIES))}, all"
            )
    return names


def reproduce(
    names: list[str], mode: str, out: Path, progress: bool = True, seeds: int | None = None
) -> list[Any]:
    """Run each study of ``names`` into ``out / NAME``, printing where its report goes and its
    claims' verdicts; with several, write an index over them. Returns their results."""
    from convergent.studies import write_index

    results = []
    for name in names:
        print(f"{name} ({mode}): running, report into {out / name}", flush=True)
        result = run_one_study(name, mode, out, progress, seeds)
        results.append(result)
        print(f"{name} ({mode}): {out / name / 'report.md'} ({result.seconds:.0f} s)")
        for claim in result.claims:
            print(f"  [{claim.label}] {claim.statement}: {claim.summary()}")
        sys.stdout.flush()
    if len(results) > 1:
        print(f"index: {write_index(results, out)}")
    return results


def reproduce_part(
    names: list[str],
    part: str,
    mode: str,
    out: Path,
    onto: Path | None,
    progress: bool = True,
    seeds: int | None = None,
) -> Any:
    """Run ``part`` of the one study in ``names`` alone and add it to its results in ``onto``
    (default ``out / NAME``), printing where the report went and every claim's verdict."""
    from convergent.studies import run_study_part
    from convergent.studies.framework import PartRefused

    if len(names) != 1:
        raise UserError(f"--part runs a part of one study, got {', '.join(names)}")
    (name,) = names
    target = out / name if onto is None else onto
    print(f"{name} ({mode}) part {part}: running, adding it to {target}", flush=True)
    try:
        result = run_study_part(name, mode, part, out, onto, progress, seeds)
    except PartRefused as refused:
        raise UserError(str(refused)) from None
    print(f"{name} ({mode}) part {part}: {target / 'report.md'} ({result.seconds:.0f} s in all)")
    for claim in result.claims:
        print(f"  [{claim.label}] {claim.statement}: {claim.summary()}")
    return result


def run_pilot(names: list[str], out: Path, progress: bool = True) -> Path:
    """Run (or resume) the regime pilot of the one study in ``names`` into
    ``out / NAME-pilot``; returns the ``pilot.json`` written."""
    from convergent.io import write_text_atomically
    from convergent.studies.framework import json_ready

    pilot = pilot_of(names[0]) if len(names) == 1 else None
    if pilot is None:
        raise UserError(
            f"--pilot runs one study that has a pilot ({' or '.join(piloted_studies())}),"
            f" got {', '.join(names)}"
        )
    (name,) = names
    folder = out / f"{name}-pilot"
    result = pilot(folder, log=print if progress else lambda line: None)
    path = folder / "pilot.json"
    write_text_atomically(path, json.dumps(json_ready(result), indent=2) + "\n")
    print(f"{name} pilot: {path} (chosen: {result['chosen']}, used: {result['used']})")
    return path
