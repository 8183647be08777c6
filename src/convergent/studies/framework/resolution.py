"""The smallest effect each claim's design can resolve (STUDIES.md rule 9), from stored numbers.

A claim's verdict is decided by where its 95 % interval lies against the claim's threshold, so
the design resolves an effect that lies farther from the threshold than the interval's
half-width, and no nearer one. The half-width comes from what the claim stores:

- a Student-t interval over ``n`` per-seed values (paired differences where runs share a
  seed): ``t(0.975, n - 1) x SD / sqrt(n)``, with the SD of the stored per-seed values, this
  run's estimate of the spread a rerun at the same test size and seed count would have;
- an interval over test items and seeds together (descent's crossed intervals): the half-width
  stored in the claim's ``extra["resolution"]``, computed from the per-item marks;
- one seed: no interval, nothing resolved beyond the point estimate.

Where the observed effect lies nearer the threshold than the half-width, the report says how
many seeds the same per-seed spread would need to resolve that distance; a two-sided margin
narrower than the half-width is named: no result of this design could show equivalence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from convergent.studies.framework.claims import CONFIDENCE
from convergent.studies.framework.numbers import format_number, stored_number

MAX_SEEDS = 10_000  # beyond this many seeds, "more than" is said instead of a count


@dataclass(frozen=True)
class Resolution:
    """How finely one claim's design resolves its effect, in the claim's unit.

    Attributes:
        half_width: the 95 % interval's half-width (NaN without an interval).
        distance: how far the observed effect lies from the nearest edge of the region where
            the claim holds (NaN without an effect).
        how: how ``half_width`` was computed, in words.
        seeds_needed: seeds the per-seed spread would need to resolve ``distance`` (None when
            resolved already, or when it cannot be said).
        margin_too_narrow: a two-sided margin narrower than the half-width.
        over_seeds: the interval is a t-interval over seeds (so a seed count can be said).
    """

    half_width: float
    distance: float
    how: str
    seeds_needed: int | None = None
    margin_too_narrow: bool = False
    over_seeds: bool = True

    @property
    def resolved(self) -> bool:
        return math.isfinite(self.half_width) and self.distance > self.half_width


def t_half_width(values: Sequence[float], seeds: int | None = None) -> float:
    """The t-interval half-width of the mean of ``values`` at ``seeds`` seeds (default: as
    many as there are finite values), with their SD; NaN below 2 finite values."""
    finite = [v for v in values if math.isfinite(v)]
    count = len(finite) if seeds is None else seeds
    if len(finite) < 2 or count < 2:
        return math.nan
    spread = stats.tstd(finite)
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, count - 1)) * spread / math.sqrt(count)


def _seeds_for(values: Sequence[float], distance: float) -> int | None:
    """The fewest seeds whose t half-width at this per-seed SD falls below ``distance``."""
    if not math.isfinite(distance) or distance <= 0:
        return None
    if not t_half_width(values, MAX_SEEDS) < distance:
        return None
    low, high = 2, MAX_SEEDS  # the half-width falls with the seed count: bisect
    while low < high:
        middle = (low + high) // 2
        if t_half_width(values, middle) < distance:
            high = middle
        else:
            low = middle + 1
    return low


def claim_resolution(claim: Mapping[str, Any]) -> Resolution:
    """The resolution of one JSON claim record (a ``results.json`` claim)."""
    per_seed = [stored_number(v) for v in claim.get("per_seed", ())]
    effect = stored_number(claim.get("effect"))
    threshold = claim["threshold"]
    value = threshold["value"]
    edges = [float(v) for v in value] if threshold["form"] == "within" else [float(value)]
    distance = min(abs(effect - edge) for edge in edges) if math.isfinite(effect) else math.nan
    stored = claim.get("extra", {}).get("resolution")
    n = sum(math.isfinite(v) for v in per_seed)
    if stored is not None and math.isfinite(stored_number(stored.get("half_width"))):
        half = stored_number(stored["half_width"])
        how = (
            "stored with the claim: the half-width of its interval over test items and seeds "
            "(its evidence gives the seeds the seed-level interval would need)"
        )
        band = (edges[1] - edges[0]) / 2 if len(edges) == 2 else math.inf
        return Resolution(half, distance, how, None, band < half, over_seeds=False)
    elif n >= 2:
        half = t_half_width(per_seed)
        how = f"t(0.975, {n - 1}) x per-seed SD / sqrt({n}), from the {n} stored per-seed values"
    else:
        return Resolution(math.nan, distance, "one seed: no interval")
    band = (edges[1] - edges[0]) / 2 if len(edges) == 2 else math.inf
    needed = None if distance > half else _seeds_for(per_seed, distance)
    return Resolution(half, distance, how, needed, margin_too_narrow=band < half)


def _cell(text: str) -> str:
    """``text`` inside a markdown table cell (a literal bar escaped; common.table_cell's rule,
    which this module, imported by common, cannot import back)."""
    return text.replace("|", r"\|")


def _resolved_text(found: Resolution, n: int) -> str:
    if not math.isfinite(found.half_width):
        return "n/a"
    if found.margin_too_narrow:
        return "no: the margin is narrower than the half-width"
    if found.resolved:
        return "yes"
    if not found.over_seeds:
        return "no"
    if found.seeds_needed is None:
        return f"no (more than {MAX_SEEDS:,} seeds at this spread)"
    return f"no (about {found.seeds_needed} seeds at this spread, {n} ran)"


def resolution_lines(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's "What this design can resolve" section from JSON claim records."""
    lines = [
        "## What this design can resolve",
        "",
        "Per claim, the smallest effect its design resolves (STUDIES.md rule 9): the 95 % "
        "interval's half-width at this test size and seed count. An effect resolves when it lies "
        "farther than that from the threshold; nearer, the verdict is inconclusive. Half-width "
        "and distance are in the claim's unit.",
        "",
        "| claim (key) | unit | n (seeds) | half-width (claim's unit) | effect's distance from "
        "the threshold (claim's unit) | resolved here | how the half-width was computed |",
        "|---|---|---|---|---|---|---|",
    ]
    for claim in claims:
        found = claim_resolution(claim)
        lines.append(
            f"| `{claim['key']}` | {_cell(str(claim['unit']))} | {claim['n']} | "
            f"{format_number(found.half_width)} | {format_number(found.distance)} | "
            f"{_resolved_text(found, int(claim['n']))} | {found.how} |"
        )
    return [*lines, ""]
