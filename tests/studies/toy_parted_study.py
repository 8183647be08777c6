"""The toy study with a second part that runs alone (a
:class:`~convergent.studies.framework.PartedStudy`), for testing ``reproduce --part``.

Part "extra" measures 3 minus a seeded offset per seed, and adds a claim ("the extra is at
least 2.5") and a table. With ``WITH_EXTRA`` off, a whole run leaves the part out, as a run
of an earlier design without the part did.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from convergent.studies.framework import Measured, Report, Session, at_least, claim_from_seeds
from convergent.studies.framework.claims import Claim
from tests.studies.toy_study import OFFSETS, Config, ToyStudy
from tests.studies.toy_study import claims_from_results as toy_claims

WITH_EXTRA = [True]  # whether a whole run measures part "extra"
COMPUTED: list[int] = []  # the seeds part "extra" measured in this process


def _extra(seed: int) -> dict[str, Any]:
    COMPUTED.append(seed)
    return {"extra": 3.0 - OFFSETS[seed % len(OFFSETS)]}


def claims_from_results(results: dict[str, Any]) -> list[Claim]:
    claims = toy_claims(results)
    if "extra" in results["data"]:
        values = [unit["extra"] for unit in results["data"]["extra"]]
        claims.append(
            claim_from_seeds(
                "the extra is at least 2.5",
                values,
                at_least(2.5),
                key="toy.extra",
                unit="(an extra)",
            )
        )
    return claims


class PartedToyStudy(ToyStudy):
    name = "toyparts"
    parts = {"extra": "three minus an offset"}  # noqa: RUF012 - a test's constant
    claims_from_results = staticmethod(claims_from_results)

    def measure(self, config: Config, session: Session) -> Measured:
        measured = super().measure(config, session)
        if WITH_EXTRA[0]:
            part = self.measure_part(config, "extra", session)
            measured.data |= part.data
            measured.tuning |= part.tuning
        return measured

    def measure_part(self, config: Config, part: str, session: Session) -> Measured:
        units = [
            session.cache.run({"part": part, "seed": seed}, functools.partial(_extra, seed))
            for seed in config.seeds
        ]
        grid = {
            "points": [{"k": 1, "validation": 0.5}],
            "criterion": "a toy score",
            "selected": {"k": 1},
            "on_edge": [],
        }
        return Measured({"extra": units}, tuning={"extra's grid": {"toy": grid}})

    def report(self, config: Config, measured: Measured, folder: Path) -> Report:
        report = super().report(config, measured, folder)
        if "extra" in measured.data:
            part = self.report_part(config, "extra", measured, folder)
            report.tables |= part.tables
            report.notes = part.notes
        return report

    def report_part(self, config: Config, part: str, measured: Measured, folder: Path) -> Report:
        extra = [unit["extra"] for unit in measured.data["extra"]]
        return Report(
            tables={
                "extra": [{"seed": s, "extra": e} for s, e in zip(config.seeds, extra, strict=True)]
            },
            notes=[f"{len(measured.data['units'])} sums and {len(extra)} extras."],
        )


STUDY = PartedToyStudy()
