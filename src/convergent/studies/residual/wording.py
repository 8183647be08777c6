"""The words the ``residual`` study's summary and brief share: numbers to two figures, a claim's
interval and failed checks, a regime's step sizes in words, and the step sizes tuning selected,
read from a ``results.json`` payload."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from convergent.studies.framework import claims_by_key, listed
from convergent.studies.framework import stored_number as number
from convergent.studies.residual.claims import regime_key
from convergent.studies.residual.measures import Regime


def two_figures(value: float) -> str:
    """Two significant figures; scientific notation outside [1e-4, 1e4)."""
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    if 1e-4 <= abs(value) < 1e4:
        digits = 1 - math.floor(math.log10(abs(value)))
        return f"{round(value, digits):.{max(digits, 0)}f}"
    return f"{value:.2g}"


def interval_text(record: Mapping[str, Any], scale: Any = None) -> str:
    """`` [low, high]`` of a claim's interval (through ``scale``), nothing for none."""
    interval = record.get("interval")
    if not interval:
        return ""
    low, high = (number(v) for v in interval)
    if scale is not None:
        low, high = scale(low), scale(high)
    return f" [{two_figures(low)}, {two_figures(high)}]"


def failed_checks(record: Mapping[str, Any]) -> str:
    """Which manipulation checks of a claim did not pass, by their short names."""
    names = [
        "'" + str(c["name"]).partition(": ")[0].partition(" (")[0] + "'"
        for c in record["checks"]
        if c["passed"] is not True
    ]
    if not names:
        return "every check passed"
    names = list(dict.fromkeys(names))
    return f"the check{'s' * (len(names) > 1)} {listed(names)} did not pass"


def untested_at(regime: Regime, record: Mapping[str, Any]) -> str:
    """``"<regime>, where <why>"`` for a claim left untested in ``regime``: its failed checks,
    after how many of the regime's runs diverged where any did (a diverged run has no speed
    or band, so a check reads "not measured" for it)."""
    runs = [run for seed in regime.seeds for run in regime.runs[seed]]
    diverged = sum(bool(run.get("diverged")) for run in runs)
    why = failed_checks(record)
    if diverged:
        why = f"{diverged} of {len(runs)} runs diverged and {why}"
    return f"{regime_label(regime)}, where {why}"


def held_key(payload: Mapping[str, Any], claim: str, regime: Regime | None = None) -> str | None:
    """The key of ``claim`` (a key, or with ``regime`` one of `LINEAR`, `SPEED` and `RATE`)
    where the results hold such a claim (a part or regime that did not run has none)."""
    key = claim if regime is None else regime_key(claim, regime.lr)
    return key if key in claims_by_key(payload) else None


def regime_label(regime: Regime) -> str:
    if regime.lr is not None:
        return f"step size {regime.lr:g}"
    low, high = min(regime_lrs(regime)), max(regime_lrs(regime))
    return f"tuned step sizes of {low:g}-{high:g}" if low < high else f"tuned step size {low:g}"


def regime_lrs(regime: Regime) -> list[float]:
    return [number(run["lr"]) for seed in regime.seeds for run in regime.runs[seed]]


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def selected_lrs(payload: Mapping[str, Any]) -> dict[float, float]:
    """beta -> its selected step size in the tuned regime (from the tuning rows)."""
    rows = payload["data"].get("lr_tuning") or []
    return {number(r["beta"]): number(r["lr"]) for r in rows if r.get("selected")}
