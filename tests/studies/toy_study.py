"""A study module with the real interface and no work, for testing the CLI's plumbing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from convergent.studies.common import Claim, StudyResult, check_mode


@dataclass(frozen=True)
class Config:
    mode: str = "quick"

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        check_mode(mode)
        return cls(mode=mode)


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    result = StudyResult(name="toy", mode=config.mode, config=config)
    result.tables["numbers"] = [{"x": 1, "y": 2.5}]
    result.claims = [Claim("one plus one is two", config.mode != "smoke", "measured 2")]
    return result
