"""The ``langevin`` study's parts: the pilot, the temperatures, each lam selection and each
(experiment, seed)'s final runs, as units of the framework's resumable `UnitCache`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from convergent.studies.engine import Unit, run_finals, run_units
from convergent.studies.framework import Measured, Report, Session, Study, json_ready
from convergent.studies.langevin.brief import advice, brief
from convergent.studies.langevin.claims import DESIGN, FAMILIES, claims_from_results
from convergent.studies.langevin.config import Config
from convergent.studies.langevin.models import DarcyData, darcy_pool
from convergent.studies.langevin.pilot import PILOT_OVERFIT, regime_named, run_pilot
from convergent.studies.langevin.plots import plot_curves, plot_norms
from convergent.studies.langevin.report import notes_of, tables_of
from convergent.studies.langevin.runs import EXPERIMENTS, final_runs, temperatures
from convergent.studies.langevin.selection import select_lam
from convergent.studies.langevin.summary import summary

# The design of this study's units (`Study.unit_design`).
UNIT_DESIGN = 2


class LangevinStudy:
    """The ``langevin`` study for the framework (:class:`~convergent.studies.framework.Study`)."""

    name = "langevin"
    design = DESIGN
    unit_design = UNIT_DESIGN
    config = staticmethod(Config.for_mode)
    families = FAMILIES
    claims_from_results = staticmethod(claims_from_results)
    summary = staticmethod(summary)
    brief = staticmethod(brief)
    advice = staticmethod(advice)

    def reserved_seeds(self, config: Config) -> set[int]:
        return {config.selection_seed}

    def threads(self, config: Config) -> int:
        return config.threads

    def measure(self, config: Config, session: Session) -> Measured:
        """The pilot (unless the config names a regime), the temperatures, each experiment's
        lam selection and its final runs."""
        settings = json_ready(asdict(config))

        def unit(key: dict[str, Any], compute: Callable[..., Any], *arguments: Any) -> Unit:
            return Unit(key, compute, arguments, config.threads)

        def units(*listed: Unit) -> list[Any]:
            return run_units(session.cache, listed, config.workers, session.log)

        if config.regime is None:
            arguments = (config.pilot_steps, config.validation_fields, config.selection_seed, None)
            (pilot,) = units(unit({"part": "pilot"}, run_pilot, *arguments))
            regime = regime_named(pilot["chosen"])
        else:
            pilot, regime = None, regime_named(config.regime)
        data: DarcyData = darcy_pool(
            regime["train_fields"], config.validation_fields, config.test_fields
        )
        d_model = int(regime["d_model"])
        (levels,) = units(unit({"part": "temperatures"}, temperatures, settings, data, d_model))
        s = levels["s"]
        common = (settings, data, d_model, s)
        selections = units(
            *(
                unit({"part": "selection", "experiment": e}, select_lam, e, *common)
                for e in EXPERIMENTS
            )
        )
        factors = {
            e: {k: v["selected"] for k, v in chosen["penalties"].items()}
            for e, chosen in zip(EXPERIMENTS, selections, strict=True)
        }

        def final(e: str, factor: dict[str, Any], seed: int) -> Unit:
            key = {"part": "final", "experiment": e, "seed": seed}
            return unit(key, final_runs, e, seed, settings, data, d_model, s, factor)

        runs = run_finals(session.cache, factors, config.seeds, final, config.workers, session.log)
        chosen_by = dict(zip(EXPERIMENTS, selections, strict=True))
        return Measured(
            {
                "regime": {**regime, **_overfit(pilot, regime)},
                "pilot": pilot,
                "labels_std": data.labels_std,
                "temperatures": s,
                "noise_variance": levels["noise_variance"],
                "calibration": levels,
                "selection": {e: chosen["penalties"] for e, chosen in chosen_by.items()},
                "selection_temperature": {
                    e: chosen["temperature"] for e, chosen in chosen_by.items()
                },
                "runs": runs,
            }
        )

    def report(self, config: Config, measured: Measured, folder: Path) -> Report:
        stored = json_ready(measured.data)
        return Report(
            tables_of(stored, config),
            [*plot_norms(stored, config, folder), *plot_curves(stored, folder)],
            notes_of(config, stored),
        )


def _overfit(pilot: dict[str, Any] | None, regime: dict[str, Any]) -> dict[str, Any]:
    """The chosen regime's pilot ratio and the declared minimum (NaN without a pilot)."""
    row = next((r for r in (pilot or {}).get("rows", []) if r["name"] == regime["name"]), None)
    return {
        "overfit_ratio": float(row["ratio"]) if row else float("nan"),
        "overfit_required": PILOT_OVERFIT,
    }


STUDY: Study = LangevinStudy()
