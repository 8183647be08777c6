"""``convergent report``: the README's results section, generated from the study reports in
a folder (``NAME/results.json``), printed or written between the README's results markers;
with ``--rescore``, each report's claims are first scored again from its numbers."""

from __future__ import annotations

import argparse
from pathlib import Path

from convergent.commands.flags import UserError


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``report`` and its flags to ``commands``."""
    parser = commands.add_parser(
        "report",
        help="the results section of a README, generated from study reports",
        description="Read every NAME/results.json under FOLDER and print the results section"
        " (each claim with its verdict, effect, interval, seeds and manipulation checks), or"
        " write it into a README between its results markers.",
    )
    parser.add_argument("folder", type=Path, help="a folder of study reports, e.g. docs/results")
    parser.add_argument(
        "--readme", type=Path, default=None, help="rewrite this README's results section"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --readme: write nothing, exit 1 if the README's section is out of date",
    )
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="first re-score every report's claims from its results.json (numbers unchanged)",
    )
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    """``convergent report``'s parsed flags: rescore, then print or write the section."""
    if not arguments.folder.is_dir():
        raise UserError(f"{arguments.folder} is not a folder of study reports")
    if arguments.check and arguments.readme is None:
        raise UserError("--check needs --readme README to compare with")
    if arguments.rescore:
        rescore_reports(arguments.folder)
    if arguments.readme is None:
        print(results_text(arguments.folder), end="")
        return 0
    return write_readme(arguments.readme, arguments.folder, check=arguments.check)


def rescore_reports(folder: Path) -> None:
    """Score the claims of every report in ``folder`` again from its results.json (a report
    of a design the code no longer scores is left as it was), saying what became of each."""
    from convergent.studies import rescore
    from convergent.studies.framework import OtherDesign

    for path in sorted(folder.glob("*/results.json")):
        try:
            result = rescore(path.parent)
        except OtherDesign as refused:
            print(f"left {path.parent} as scored then: {refused}")
            continue
        print(f"re-scored {path.parent}: {len(result.claims)} claims")


def results_text(folder: Path) -> str:
    """The results section of the reports in ``folder``, as the README holds it."""
    from convergent.studies import study_advice, study_summary
    from convergent.studies.framework.readme import results_section

    return results_section(folder, summarize=study_summary, advise=study_advice)


def write_readme(readme: Path, folder: Path, check: bool = False) -> int:
    """Write the results section of ``folder``'s reports into ``readme`` (with ``check``:
    only compare); returns the exit status, 1 where ``check`` finds it out of date."""
    from convergent.studies import study_advice, study_summary
    from convergent.studies.framework.readme import update_readme

    current = update_readme(
        readme, folder, check=check, summarize=study_summary, advise=study_advice
    )
    if check:
        state = "up to date" if current else "out of date; run without --check to rewrite it"
        print(f"{readme}: results section {state}")
        return 0 if current else 1
    print(f"{readme}: results section {'unchanged' if current else 'rewritten'}")
    return 0
