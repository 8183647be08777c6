"""Every verdict a claim has had, side by side: earlier designs as scored then, the current
tests rescored on their data (exploratory), and the current design.

A redesigned claim never silently replaces its predecessor. The committed results of a study's
earlier designs live in ``docs/results/<study>-full/history/design<N>.results.json`` (or
``.json.gz``) with the claims they were scored with; :func:`history_lines` puts each claim's
verdicts from all of them in one table, with what changed in its test and why (the claim's
``revised`` field). Claims are matched across designs by their keys (a redesign keeps a
claim's key; every committed result carries keys). An earlier claim
with no counterpart is listed below the table.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from convergent.studies.framework.common import printed_verdict, table_cell
from convergent.studies.framework.numbers import format_interval, format_number

HISTORY_FILE = re.compile(r"design(?P<design>\d+)(\.(?P<tag>[a-z0-9-]+))?\.results\.json(\.gz)?$")
# A history file may hold a design's results as scored by earlier statistics, kept beside the
# current scoring when a conservative change of the statistics re-scored them without new
# seeds (STUDIES.md rule 16): ``design<N>.<tag>.results.json``, the tag naming the change.
SCORED_AS = {
    "before-kept-variance": (
        "as scored before two-way intervals kept every variance term and before Holm's "
        "adjustment (the same data, re-scored without new seeds)"
    ),
}

Records = Sequence[Mapping[str, Any]]
Rescore = Callable[[Mapping[str, Any]], Records]


def earlier_designs(folder: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(design, payload)`` for each ``history/design<N>[.<tag>].results.json[.gz]`` in
    ``folder``, oldest first (none when there is no history folder); a tagged file's payload
    says under ``"scored_as"`` which scoring it keeps (:data:`SCORED_AS`)."""
    found = []
    for path in sorted(Path(folder, "history").glob("design*.results.json*")):
        match = HISTORY_FILE.search(path.name)
        if match is None or (match["tag"] is not None and match["tag"] not in SCORED_AS):
            continue
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        payload = json.loads(raw)
        if match["tag"] is not None:
            payload["scored_as"] = SCORED_AS[match["tag"]]
        found.append((int(match["design"]), payload))
    return sorted(found, key=lambda pair: pair[0])


def seeds_text(payload: Mapping[str, Any]) -> str:
    """``"seeds 1-5"`` (a consecutive run) or ``"seeds 1, 3, 7"``."""
    seeds = [int(seed) for seed in payload["config"].get("seeds", ())]
    if not seeds:
        return "no seeds"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 2:
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def _verdict_cell(claim: Mapping[str, Any] | None) -> str:
    if claim is None:
        return "—"
    interval = claim.get("interval")
    shown = format_interval(None if interval is None else (interval[0], interval[1]))
    return f"{printed_verdict(claim)}: {format_number(claim.get('effect'))} {shown}"


def _by_key(claims: Records) -> dict[str, Mapping[str, Any]]:
    return {str(claim["key"]): claim for claim in claims}


def history_lines(
    current: Mapping[str, Any],
    design: int,
    earlier: Sequence[tuple[int, Mapping[str, Any]]],
    rescore: Rescore | None = None,
) -> list[str]:
    """The report's "Verdicts across designs" section (nothing without earlier designs).

    Args:
        current: the current ``results.json`` payload (its ``claims`` scored by the current
            design's code; exploratory when its data is an earlier design's).
        design: the current design's number.
        earlier: ``(design, payload)`` of each earlier design, as `earlier_designs` reads them.
        rescore: the current claims as JSON records from an earlier payload; raises a
            ValueError for a design the current code cannot score. Where it scores one whose
            seeds are not the current payload's, its verdicts get their own column.

    Returns:
        Markdown lines: a heading, a legend, the table and the unmatched earlier claims.
    """
    if not earlier:
        return []
    # (column title, who scored it in a sentence, claims by name)
    columns: list[tuple[str, str, dict[str, Mapping[str, Any]]]] = []
    for number, payload in earlier:
        columns.append(
            (
                f"design {number}, {seeds_text(payload)}, "
                + payload.get("scored_as", "as scored then"),
                f"Design {number}'s claims",
                _by_key(payload["claims"]),
            )
        )
        if rescore is None or seeds_text(payload) == seeds_text(current):
            continue
        try:
            rescored = rescore(payload)
        except ValueError:
            continue
        columns.append(
            (
                f"design {design}'s tests on design {number}'s {seeds_text(payload)}",
                f"Design {design}'s claims on design {number}'s data",
                _by_key(rescored),
            )
        )
    claims = current["claims"]
    exploratory = any(claim.get("exploratory") for claim in claims)
    now = f"design {design}'s tests on {seeds_text(current)}" + (
        " (an earlier design's data)" if exploratory else ""
    )
    header = [
        "claim (key)",
        *(title for title, _, _ in columns),
        now,
        f"changed in design {design}, and why",
    ]
    lines = [
        "## Verdicts across designs",
        "",
        "Every verdict each claim has had: verdict, effect and 95 % interval (in the claim's "
        "unit, as in the claims table). A test changed after its data was seen is exploratory "
        "on that data; only seeds no earlier design read confirm it.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for claim in claims:
        key = str(claim["key"])
        cells = [_verdict_cell(by_key.get(key)) for _, _, by_key in columns]
        cells.append(_verdict_cell(claim))
        lines.append(
            "| "
            + " | ".join(
                [f"`{key}`", *(table_cell(t) for t in [*cells, claim.get("revised") or "—"])]
            )
            + " |"
        )
    lines.append("")
    current_keys = {str(claim["key"]) for claim in claims}
    for _, whose, by_key in columns:
        dropped = [
            f"`{k}` ({_verdict_cell(c)})" for k, c in by_key.items() if k not in current_keys
        ]
        if dropped:
            lines += [f"{whose} with no counterpart now: " + "; ".join(dropped) + ".", ""]
    return lines
