"""The depth sentence of the ``residual`` study's summary (claim 5): whether the residual
advantage grew with depth on MiniLM, which arm stayed at chance, and the deepest model's
validation errors."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.studies.framework import Sentence, claims_by_key, finite_mean, listed, verdict_of
from convergent.studies.framework import stored_number as number
from convergent.studies.residual.claims import CHANCE_FRACTION, DEPTH_CLASSES, DEPTH_KEY
from convergent.studies.residual.measures import chance_fractions, depth_gaps, seeds_in
from convergent.studies.residual.wording import failed_checks, held_key, interval_text, two_figures


def depth_errors(runs: Sequence[Mapping[str, Any]], depth: int) -> dict[float, float]:
    return {
        beta: finite_mean(
            [
                number(r["validation_error"])
                for r in runs
                if (int(r["depth"]), number(r["beta"])) == (depth, beta)
            ]
        )
        for beta in (0.0, 1.0)
    }


def at_chance(runs: Sequence[Mapping[str, Any]]) -> str:
    """Which arm stayed at chance at which depths, as a clause (empty when none did)."""
    fractions = chance_fractions(runs, DEPTH_CLASSES)
    clauses = []
    for beta, arm in ((0.0, "without residuals"), (1.0, "with residuals")):
        depths = [str(d) for (d, b), v in fractions.items() if b == beta and v > CHANCE_FRACTION]
        if depths:
            clauses.append(f"{arm} at {listed(depths)} layers")
    if not clauses:
        return ""
    return (
        f"{listed(clauses)} the train loss stayed within {1 - CHANCE_FRACTION:.0%} of chance "
        "(ln 2), so the gap had no room to grow there"
    )


def depth_sentence(payload: Mapping[str, Any]) -> Sentence:
    name = held_key(payload, DEPTH_KEY)
    runs = payload["data"].get("depth_runs") or []
    if name is None or not runs:
        return Sentence(
            "Depth was not run, so whether residuals matter more in deeper models stays unknown."
        )
    verdict, record = verdict_of(payload, name), claims_by_key(payload)[name]
    seeds = seeds_in(payload["config"], runs)
    per_seed = [depth_gaps([run for run in runs if int(run["seed"]) == seed]) for seed in seeds]
    depths = sorted({depth for gaps_of_seed in per_seed for depth in gaps_of_seed})
    gaps = {d: finite_mean([g.get(d, math.nan) for g in per_seed]) for d in depths}
    by_depth = [f"{two_figures(gap)} at {depth} layers" for depth, gap in gaps.items()]
    measured = (
        f"the training-loss gap beta 0 minus beta 1 on MiniLM was {listed(by_depth)} "
        f"(smallest growth between depths {two_figures(number(record['effect']))}{interval_text(record)})"
    )
    text = {
        "reproduced": f"The residual advantage grew with depth (reproduced): {measured}",
        "not reproduced": f"The residual advantage did not grow with depth (not reproduced): "
        f"{measured}",
        "inconclusive": "Whether the residual advantage keeps growing with depth stays unknown "
        f"(inconclusive): {measured}",
        "untested": "Whether the residual advantage grows with depth stays unknown (untested: "
        f"{at_chance(runs) or failed_checks(record)})",
    }[verdict]
    deepest = max(int(run["depth"]) for run in runs)
    errors = depth_errors(runs, deepest)
    if errors[1.0] < errors[0.0]:
        text += (
            f"; at {deepest} layers the validation error was {two_figures(errors[1.0])} with "
            f"residuals and {two_figures(errors[0.0])} without, so keep them in deep models either way"
        )
    return Sentence(text + ".", {name: verdict})
