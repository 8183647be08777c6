"""A study module with the real interface and no real work, for testing the CLI's plumbing.

Its one claim: a noisy measurement of 1 + 1 is at least 1.5. Each seed "measures" 2 plus a
seeded offset; every unit goes through the unit cache, so resuming can be tested too.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convergent.studies.framework import Advice, Measured, Report, Sentence, Session
from convergent.studies.framework.claims import Check, Claim, at_least, claim_from_seeds
from convergent.studies.framework.common import check_mode

OFFSETS = (0.1, -0.2, 0.05, 0.15, -0.1, 0.0, 0.2)
COMPUTED: list[int] = []  # the seeds measured in this process (not taken from the cache)


@dataclass(frozen=True)
class Config:
    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    scale: float = 1.0

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        check_mode(mode)
        return cls(mode=mode, seeds=(0, 1, 2) if mode == "full" else (0,))


def _measure(seed: int, scale: float) -> dict[str, Any]:
    COMPUTED.append(seed)
    return {"sum": 2.0 * scale + OFFSETS[seed % len(OFFSETS)], "moved": 1.0}


def claims_from_results(results: dict[str, Any]) -> list[Claim]:
    sums = [unit["sum"] for unit in results["data"]["units"]]
    moved = min(unit["moved"] for unit in results["data"]["units"])
    return [
        claim_from_seeds(
            "one plus one is two (here: at least 1.5)",
            sums,
            at_least(1.5),
            key="toy.one_plus_one_is_two",
            unit="(a sum)",
            checks=[Check("the adder ran", moved, at_least(1.0))],
            evidence=f"measured {', '.join(f'{s:g}' for s in sums)}",
        )
    ]


class ToyStudy:
    """The toy study, for the framework's :class:`~convergent.studies.framework.Study`."""

    name = "toy"
    design = 1
    unit_design = 1
    families = types.MappingProxyType({})  # one family: the study's
    config = staticmethod(Config.for_mode)
    claims_from_results = staticmethod(claims_from_results)

    def reserved_seeds(self, config: Config) -> set[int]:
        return set()

    def threads(self, config: Config) -> int:
        return 1

    def measure(self, config: Config, session: Session) -> Measured:
        units = [
            session.cache.run({"seed": seed}, functools.partial(_measure, seed, config.scale))
            for seed in config.seeds
        ]
        return Measured({"units": units})

    def report(self, config: Config, measured: Measured, folder: Path) -> Report:
        return Report(tables={"numbers": [{"x": 1, "y": 2.5}]})

    def summary(self, results: dict[str, Any]) -> list[Sentence]:
        return []

    def brief(self, results: dict[str, Any]) -> list[Sentence]:
        return []

    def advice(self, results: dict[str, Any]) -> list[Advice]:
        return []


STUDY = ToyStudy()
