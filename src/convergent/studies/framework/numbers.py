"""How a study writes and reads back its numbers: report formatting (4 significant digits,
``n/a`` for what is missing), JSON's stand-ins for NaN, and means over finite values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def format_interval(interval: tuple[float, float] | None) -> str:
    if interval is None:
        return "none (1 seed)"
    return f"[{format_number(interval[0])}, {format_number(interval[1])}]"


def format_number(value: float | None) -> str:
    """A number for a report: 4 significant digits, ``n/a`` for None or non-finite."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.3g}"


def stored_number(value: Any) -> float:
    """A number read back from ``results.json``: JSON keeps NaN and inf as strings, and None
    means missing (NaN here)."""
    if value is None:
        return math.nan
    return float(value)


def finite_or_none(value: float | None) -> float | None:
    """``value`` as a float when finite, else None (JSON's null)."""
    return float(value) if value is not None and math.isfinite(value) else None


def finite_mean(values: Sequence[float]) -> float:
    """The mean of the finite values (``statistics.fmean``'s sum); NaN when there are none."""
    finite = [float(v) for v in values if math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else math.nan


def format_percent(fraction: float) -> str:
    """A fraction as a percentage for a claim's text: 0.05 -> ``"5 %"`` (``:g`` digits)."""
    return f"{fraction * 100:g} %"
