"""What every study returns and how it is written to disk.

A study module (one per pillar) exposes a frozen config dataclass with
``for_mode(mode)``, ``run(config, out_dir, progress=True) -> StudyResult`` and
``claims_from_results(results) -> list[Claim]``, which scores the claims from the
``results.json`` payload alone (``config`` and ``data``), so that a committed result can be
re-scored without a re-run. The study measures; this module only writes: ``report.md``
(claims with effect, interval and manipulation checks, tuning grids, tables, figure links),
``results.json`` (every number; its ``claims`` schema is in :mod:`.claims`) and the PNG
figures the study drew.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from convergent.io import write_text_atomically
from convergent.studies.framework.claims import PREVIEW_BELOW, Claim, holm_words, qualifiers
from convergent.studies.framework.family import family_lines
from convergent.studies.framework.numbers import format_interval, format_number
from convergent.studies.framework.resolution import resolution_lines

MODES = ("smoke", "quick", "full")


def check_mode(mode: str) -> str:
    """Return ``mode`` if known, else raise a ValueError naming the choices."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


@dataclass
class StudyResult:
    """What a study measured.

    Attributes:
        name: the study's name (``descent``, ``sparsity``, ``residual``, ``langevin``).
        mode: ``smoke``, ``quick`` or ``full``.
        config: the study config (a dataclass or dict), saved with the results.
        tables: named tables, each a list of row dicts (rendered as markdown).
        claims: the paper's claims with effect, interval, checks and verdict.
        figures: PNG files the study wrote, relative to its output folder.
        data: every other number worth keeping (curves, per-seed values), JSON-serializable.
        notes: free text for the report (what was done where the paper's setting could not be
            followed, and why).
        seconds: wall time of the run.
        tuning: ``{experiment: {method: Tuning.to_json()}}``, the grid searches behind the
            selected hyperparameters.
    """

    name: str
    mode: str
    config: Any
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    tuning: dict[str, Any] = field(default_factory=dict)


def finish(
    name: str,
    config: Any,
    started: float,
    summary: str,
    *,
    claims: list[Claim],
    data: dict[str, Any],
    tables: dict[str, list[dict[str, Any]]] | None = None,
    figures: list[str] | None = None,
    notes: list[str] | None = None,
    tuning: dict[str, Any] | None = None,
) -> StudyResult:
    """The result of study ``name``: what its run measured, with the unit cache's ``summary``
    as the last note and the wall time since ``started`` (a `time.perf_counter` value).

    Args:
        name: the study.
        config: its config (``config.mode`` names the mode).
        started: when the run began.
        summary: `UnitCache.summary()` of the run.
        claims: the claims scored from the stored results.
        data: every other number the report keeps.
        tables: named tables.
        figures: PNG file names, relative to the study's folder.
        notes: the study's own notes.
        tuning: the grid searches behind the selected hyperparameters.
    """
    return StudyResult(
        name=name,
        mode=config.mode,
        config=config,
        tables=dict(tables or {}),
        claims=list(claims),
        figures=list(figures or []),
        data=data,
        notes=[*(notes or []), summary + "."],
        seconds=time.perf_counter() - started,
        tuning=dict(tuning or {}),
    )


def json_ready(value: Any) -> Any:
    """``value`` as JSON: dataclasses as dicts, tuples as lists, tensors as lists, inf as str."""
    if is_dataclass(value) and not isinstance(value, type):
        return json_ready(asdict(value))
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


VERDICT_LEGEND = (
    "Verdicts: **reproduced** (the 95 % interval of the effect lies where the claim holds), "
    "**not reproduced** (it lies wholly outside), **inconclusive** (it straddles the threshold), "
    "**untested** (a manipulation check failed or was not measured, so the method was not shown "
    "to act; the effect is still reported). Below "
    f"{PREVIEW_BELOW} seeds a verdict is a preview. An *exploratory* verdict scores a claim's "
    "current test on seeds an earlier design read, after their numbers were seen: only new "
    "seeds confirm it."
)


def table_cell(text: str) -> str:
    return text.replace("|", r"\|")  # a literal bar inside a markdown table cell


def printed_verdict(claim: Mapping[str, Any]) -> str:
    """A JSON claim record's verdict as printed, with ``(preview)`` / ``(exploratory)`` /
    ``(not after Holm over N claims)``."""
    return claim["verdict"] + qualifiers(
        claim["preview"], bool(claim.get("exploratory")), claim.get("holm"), claim["verdict"]
    )


def claim_rows(claims: list[dict[str, Any]]) -> list[str]:
    """Markdown rows ``| claim | key | verdict | effect | 95 % interval | unit | n (seeds) |
    holds if | checks |`` from JSON claim records (the ``claims`` list of ``results.json``);
    effect, interval and threshold are in the row's unit."""
    lines = [
        "| claim | key | verdict | effect | 95 % interval | unit | n (seeds) | holds if "
        "(unit) | checks (value, need) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for claim in claims:
        verdict = printed_verdict(claim)
        interval = claim["interval"]
        shown = format_interval(None if interval is None else (interval[0], interval[1]))
        checks = (
            "; ".join(
                f"{c['name']} = {format_number(c['value'])} (need {c['required']}): "
                + {True: "ok", False: "failed", None: "not measured"}[c["passed"]]
                for c in claim["checks"]
            )
            or "none"
        )
        lines.append(
            f"| {table_cell(claim['statement'])} | `{claim['key']}` | {verdict} | "
            f"{format_number(claim['effect'])} | {shown} | {table_cell(claim['unit'])} | "
            f"{claim['n']} | {claim['threshold']['text']} | {table_cell(checks)} |"
        )
    return lines


def _short_check(name: str) -> str:
    return name.partition(" (")[0].rstrip(", ")


def compact_claim_rows(claims: list[dict[str, Any]]) -> list[str]:
    """Markdown rows ``| claim (key) | verdict | effect [95 % interval] | unit | n (seeds) |``
    from JSON claim records: each claim by its key and, for an untested one, the checks that
    did not pass by name (their values, thresholds and the test's exact statement are in the
    study's report)."""
    lines = [
        "| claim (key) | verdict | effect [95 % interval] | unit | n (seeds) |",
        "|---|---|---|---|---|",
    ]
    for claim in claims:
        words = [w for w in ("preview", "exploratory") if claim.get(w)]
        words += [w for w in [holm_words(claim.get("holm"), claim["verdict"])] if w]
        if claim["verdict"] == "untested":
            failed = [_short_check(c["name"]) for c in claim["checks"] if c["passed"] is not True]
            words += dict.fromkeys(failed)
        verdict = claim["verdict"] + (f" ({'; '.join(words)})" if words else "")
        interval = claim["interval"]
        shown = format_interval(None if interval is None else (interval[0], interval[1]))
        lines.append(
            f"| `{claim['key']}` | {table_cell(verdict)} | {format_number(claim['effect'])} "
            f"{shown} | {table_cell(claim['unit'])} | {claim['n']} |"
        )
    return lines


def _setting(point: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in point.items() if key != "validation"}


def _edge_trend(record: Mapping[str, Any], axis: str) -> str:
    """The validation scores along ``axis`` at the selected values of the other axes:
    ``"0.809, 0.815, 0.825 at lr 0.0001, 0.0002, 0.0004"``."""
    chosen = record["selected"]
    line = sorted(
        (
            point
            for point in record["points"]
            if all(point.get(k) == v for k, v in chosen.items() if k != axis)
        ),
        key=lambda point: point[axis],
    )
    scores = ", ".join(format_number(point["validation"]) for point in line)
    values = ", ".join(f"{point[axis]:g}" for point in line)
    return f"validation {scores} at {axis} {values}"


def tuning_lines(tuning: dict[str, Any]) -> list[str]:
    """The report's tuning section from ``StudyResult.tuning``: every point that ran, every
    point of the declared axes that did not (marked "not run"), and for a selection on the
    edge of its grid the scores toward that edge, with the live explanation it leaves."""
    from convergent.report import markdown_table
    from convergent.studies.framework.tuning import grid_points

    lines: list[str] = []
    for experiment, methods in tuning.items():
        first = next(iter(methods.values()))
        counts = []
        rows = []
        for method, record in methods.items():
            ran = [_setting(point) for point in record["points"]]
            declared = grid_points(record["grid"]) if record.get("grid") else []
            missing = [point for point in declared if point not in ran]
            counts.append(f"{method} {len(ran)} of the declared axes' {len(declared)} points")
            for point in record["points"]:
                setting = _setting(point)
                rows.append(
                    {
                        "method": method,
                        **setting,
                        "validation": format_number(point["validation"]),
                        "selected": "yes" if setting == record["selected"] else "",
                    }
                )
            rows += [
                {"method": method, **point, "validation": "not run", "selected": ""}
                for point in missing
            ]
        lines += [
            f"### {experiment}",
            "",
            f"Selected on {first['criterion']}; the test split is not read while tuning. "
            f"Points run: {', '.join(counts)}.",
            "",
        ]
        settings = dict.fromkeys(
            key for record in methods.values() for point in record["points"] for key in point
        )
        settings.pop("validation", None)
        lines.append(markdown_table(rows, ["method", *settings, "validation", "selected"]))
        for method, record in methods.items():
            if not record["on_edge"]:
                continue
            trends = "; ".join(_edge_trend(record, axis) for axis in record["on_edge"])
            lines += [
                f"{method} was selected on the edge of its grid ({trends}): the best value may "
                f'lie outside it, so "{method} undertuned" is a live explanation of any '
                "difference from it.",
                "",
            ]
    return lines


def render_markdown(
    result: StudyResult, summary: Sequence[str] = (), history: Sequence[str] = ()
) -> str:
    """The study's ``report.md``, opening with its plain ``summary`` sentences; ``history``
    (the "Verdicts across designs" lines of :mod:`.history`) follows the claims."""
    from convergent.report import markdown_table

    lines = [f"# Study `{result.name}` ({result.mode} mode)", ""]
    if summary:
        lines += [" ".join(summary), ""]
    if result.claims:
        records = [claim.to_json() for claim in result.claims]
        lines += ["## Claims", "", VERDICT_LEGEND, "", *claim_rows(records), ""]
        lines += family_lines(records)
        lines += ["Evidence and how each interval was computed:", ""]
        for index, claim in enumerate(result.claims, 1):
            lines.append(f"{index}. {claim.evidence} ({claim.interval_method}.)")
            lines += [f"   - check note: {c.name}: {c.note}" for c in claim.checks if c.note]
        lines.append("")
        lines += resolution_lines(records)
    lines += history
    if result.tuning:
        lines += ["## Tuning", "", *tuning_lines(result.tuning)]
    for title, rows in result.tables.items():
        lines += [f"## {title}", "", markdown_table(rows)]
    if result.figures:
        lines += ["## Figures", ""]
        lines += [f"![{Path(f).stem}]({f})" for f in result.figures]
        lines.append("")
    if result.notes:
        lines += ["## Notes", ""] + [f"- {note}" for note in result.notes] + [""]
    lines.append(f"Run time: {result.seconds:.0f} s.")
    return "\n".join(lines) + "\n"


def results_payload(result: StudyResult) -> dict[str, Any]:
    """The ``results.json`` object of ``result`` (claims schema: :mod:`.claims`)."""
    return {
        "name": result.name,
        "mode": result.mode,
        "config": json_ready(result.config),
        "claims": [claim.to_json() for claim in result.claims],
        "tuning": json_ready(result.tuning),
        "tables": json_ready(result.tables),
        "figures": result.figures,
        "data": json_ready(result.data),
        "notes": result.notes,
        "seconds": result.seconds,
    }


def write_study(
    result: StudyResult,
    out_dir: str | Path,
    summary: Sequence[str] = (),
    history: Sequence[str] = (),
) -> Path:
    """Write ``report.md`` (opening with the ``summary`` sentences, with the ``history``
    section after the claims) and ``results.json`` into ``out_dir``; returns the report
    path."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    payload = results_payload(result)
    write_text_atomically(folder / "results.json", json.dumps(payload, indent=2) + "\n")
    report = folder / "report.md"
    write_text_atomically(report, render_markdown(result, summary, history))
    return report


def load_study(folder: str | Path) -> StudyResult:
    """A study's ``results.json`` back as a StudyResult, without its claims (re-score them
    with the study module's ``claims_from_results``)."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give a folder written by a study")
    payload = json.loads(path.read_text())
    return StudyResult(
        name=payload["name"],
        mode=payload["mode"],
        config=payload["config"],
        tables=payload.get("tables", {}),
        figures=payload.get("figures", []),
        data=payload.get("data", {}),
        notes=payload.get("notes", []),
        seconds=payload.get("seconds", 0.0),
        tuning=payload.get("tuning", {}),
    )
