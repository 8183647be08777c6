"""Studies: one module per pillar, each reproducing its paper's claim at small scale.

Each study module defines a frozen ``Config`` with ``Config.for_mode(mode)`` and
``run(config, out_dir, progress=True) -> StudyResult``. Modules are imported only when a
study runs, so that ``import convergent`` stays light.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from types import ModuleType

from .common import MODES, Claim, StudyResult, check_mode, render_markdown, write_study

# name -> module; a study is listed here once it exists.
STUDIES: dict[str, str] = {
    "descent": "convergent.studies.descent",
    "langevin": "convergent.studies.langevin",
    "residual": "convergent.studies.residual",
    "sparsity": "convergent.studies.sparsity",
}


def get_study(name: str) -> ModuleType:
    """The module of study ``name``; raises a ValueError listing the known studies."""
    if name not in STUDIES:
        known = ", ".join(sorted(STUDIES)) or "none yet"
        raise ValueError(f"unknown study {name!r}; the studies are: {known}")
    return importlib.import_module(STUDIES[name])


def run_study(name: str, mode: str, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run study ``name`` at ``mode`` size and write its report into ``out_dir / name``."""
    check_mode(mode)
    module = get_study(name)
    folder = Path(out_dir) / name
    started = time.perf_counter()
    result: StudyResult = module.run(module.Config.for_mode(mode), folder, progress=progress)
    result.seconds = result.seconds or time.perf_counter() - started
    write_study(result, folder)
    return result


def write_index(results: list[StudyResult], out_dir: str | Path) -> Path:
    """A ``README.md`` over several studies: each claim's verdict, linking each report."""
    lines = [
        "# Studies",
        "",
        "| study | mode | claim | verdict | evidence |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        link = f"[{result.name}]({result.name}/report.md)"
        for claim in result.claims or [Claim("(no claims)", None, "")]:
            lines.append(
                f"| {link} | {result.mode} | {claim.statement} | {claim.verdict} | {claim.evidence} |"
            )
    index = Path(out_dir) / "README.md"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text("\n".join(lines) + "\n")
    return index


__all__ = [
    "MODES",
    "STUDIES",
    "Claim",
    "StudyResult",
    "check_mode",
    "get_study",
    "render_markdown",
    "run_study",
    "write_index",
    "write_study",
]
