"""Every verdict a claim has had, side by side: earlier designs as scored then, the current
tests rescored on their data (exploratory), and the current design.

A redesigned claim never silently replaces its predecessor. The committed results of a study's
earlier designs live in ``docs/results/<study>-full/history/design<N>.results.json`` (or
``.json.gz``) with the claims they were scored with; :func:`history_lines` puts each claim's
verdicts from all of them in one table, with what changed in its test and why (the claim's
``revised`` field). Claims are matched across designs by their names (`claim_names`: the
paper's words, which a redesign keeps), ignoring a parenthesis nested in a name's last one
(a selection such as "lr tuned per beta (0: 0.8, ...)" that earlier designs' names carried).
Where names still differ, an earlier name that is a current one with a qualifier appended
(" (ratio HORST / AdamW)") matches it when neither side has another such candidate. An
earlier claim with no counterpart is listed below the table.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from convergent.studies.framework.claims import format_interval, format_number
from convergent.studies.framework.common import claim_names, printed_verdict, table_cell

HISTORY_FILE = re.compile(r"design(?P<design>\d+)\.results\.json(\.gz)?$")
# A parenthesis inside a claim name's last one: " (0: 0.8, 0.25: 0.8)" in "(lr tuned per beta
# (0: 0.8, 0.25: 0.8), 2000 steps)".
NESTED = re.compile(r" \([^()]*\)(?=[^()]*\)$)")
# A qualifier at a name's end: " (ratio HORST / AdamW)" in "... than an AdamW-trained one
# (ratio HORST / AdamW)".
QUALIFIER = re.compile(r" \([^()]*\)$")

Records = Sequence[Mapping[str, Any]]
Rescore = Callable[[Mapping[str, Any]], Records]


def earlier_designs(folder: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(design, payload)`` for each ``history/design<N>.results.json[.gz]`` in ``folder``,
    oldest first (none when there is no history folder)."""
    found = []
    for path in sorted(Path(folder, "history").glob("design*.results.json*")):
        match = HISTORY_FILE.search(path.name)
        if match is None:
            continue
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        found.append((int(match["design"]), json.loads(raw)))
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


def comparable_name(name: str) -> str:
    """``name`` without a parenthesis nested in its last one: what matches across designs."""
    return NESTED.sub("", name)


def _by_name(claims: Records) -> dict[str, Mapping[str, Any]]:
    return {comparable_name(n): c for n, c in zip(claim_names(claims), claims, strict=True)}


def _counterparts(current: Sequence[str], earlier: Sequence[str]) -> dict[str, str]:
    """Each current (comparable) name's earlier counterpart: the same name, else the one
    earlier name that is it with a qualifier appended, where no other current name could
    claim that earlier name."""
    found = {name: name for name in current if name in earlier}
    bases: dict[str, list[str]] = {}
    for name in earlier:
        if name not in found.values():
            bases.setdefault(QUALIFIER.sub("", name), []).append(name)
    unmatched = [name for name in current if name not in found]
    for name in unmatched:
        candidates = bases.get(name, [])
        # Another current name that is this one with a qualifier: the qualifiers then tell
        # claims apart, and an earlier one's may name either.
        rivals = [other for other in current if other != name and QUALIFIER.sub("", other) == name]
        if len(candidates) == 1 and not rivals:
            found[name] = candidates[0]
    return found


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
                f"design {number}, {seeds_text(payload)}, as scored then",
                f"Design {number}'s claims",
                _by_name(payload["claims"]),
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
                _by_name(rescored),
            )
        )
    claims = current["claims"]
    exploratory = any(claim.get("exploratory") for claim in claims)
    now = f"design {design}'s tests on {seeds_text(current)}" + (
        " (an earlier design's data)" if exploratory else ""
    )
    names = claim_names(claims)
    comparable = [comparable_name(name) for name in names]
    counterparts = [_counterparts(comparable, list(by_name)) for _, _, by_name in columns]
    header = [
        "claim",
        *(title for title, _, _ in columns),
        now,
        f"changed in design {design}, and why",
    ]
    lines = [
        "## Verdicts across designs",
        "",
        "Every verdict each claim has had: verdict, effect and 95 % interval. A test changed "
        "after its data was seen is exploratory on that data; only seeds no earlier design read "
        "confirm it.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, key, claim in zip(names, comparable, claims, strict=True):
        cells = [
            _verdict_cell(by_name.get(found.get(key, "")))
            for (_, _, by_name), found in zip(columns, counterparts, strict=True)
        ]
        cells.append(_verdict_cell(claim))
        lines.append(
            "| "
            + " | ".join(table_cell(text) for text in [name, *cells, claim.get("revised") or "—"])
            + " |"
        )
    lines.append("")
    for (_, whose, by_name), found in zip(columns, counterparts, strict=True):
        matched = set(found.values())
        dropped = [f"{n} ({_verdict_cell(c)})" for n, c in by_name.items() if n not in matched]
        if dropped:
            lines += [f"{whose} with no counterpart now: " + "; ".join(dropped) + ".", ""]
    return lines
