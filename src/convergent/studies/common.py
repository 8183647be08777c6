"""What every study returns and how it is written to disk.

A study module (one per pillar) exposes a frozen config dataclass with
``for_mode(mode)`` and ``run(config, out_dir, progress=True) -> StudyResult``. The study
measures; this module only writes: ``report.md`` (markdown tables, claims and verdicts,
figure links), ``results.json`` (every number) and the PNG figures the study drew.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

MODES = ("smoke", "quick", "full")


def check_mode(mode: str) -> str:
    """Return ``mode`` if known, else raise a ValueError naming the choices."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class Claim:
    """A paper's claim and what this run found.

    Attributes:
        statement: the claim, in the paper's terms.
        reproduced: True, False, or None when this run cannot decide (e.g. smoke size).
        evidence: the measured numbers behind the verdict, in one or two sentences.
    """

    statement: str
    reproduced: bool | None
    evidence: str

    @property
    def verdict(self) -> str:
        """A word for the report: reproduced, not reproduced, or undecided."""
        if self.reproduced is None:
            return "undecided"
        return "reproduced" if self.reproduced else "NOT reproduced"


@dataclass
class StudyResult:
    """What a study measured.

    Attributes:
        name: the study's name (``descent``, ``sparsity``, ``residual``, ``langevin``).
        mode: ``smoke``, ``quick`` or ``full``.
        config: the study config (a dataclass or dict), saved with the results.
        tables: named tables, each a list of row dicts (rendered as markdown).
        claims: the paper's claims with verdicts.
        figures: PNG files the study wrote, relative to its output folder.
        data: every other number worth keeping (curves, per-seed values), JSON-serializable.
        notes: free text for the report (what was done where the paper's setting could not be
            followed, and why).
        seconds: wall time of the run.
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


def _json_ready(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _json_ready(asdict(value))
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def render_markdown(result: StudyResult) -> str:
    """The study's ``report.md``."""
    from ..report import markdown_table

    lines = [f"# Study `{result.name}` ({result.mode} mode)", ""]
    if result.claims:
        lines += ["## Claims", "", "| claim | verdict | evidence |", "|---|---|---|"]
        lines += [f"| {c.statement} | {c.verdict} | {c.evidence} |" for c in result.claims]
        lines.append("")
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


def write_study(result: StudyResult, out_dir: str | Path) -> Path:
    """Write ``report.md`` and ``results.json`` into ``out_dir``; returns the report path."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "name": result.name,
        "mode": result.mode,
        "config": _json_ready(result.config),
        "tables": _json_ready(result.tables),
        "claims": [{**asdict(claim), "verdict": claim.verdict} for claim in result.claims],
        "figures": result.figures,
        "data": _json_ready(result.data),
        "notes": result.notes,
        "seconds": result.seconds,
    }
    (folder / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    report = folder / "report.md"
    report.write_text(render_markdown(result))
    return report
