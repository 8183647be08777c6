"""The ``descent`` study's part (c) claims, the language model's win rates and per-layer
losses (their definitions: :mod:`~convergent.studies.descent.claims`). A payload without
``data["language"]`` (design 2's, or one with ``run_language`` off) has no part (c) claims.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from convergent.studies.descent.checks import (
    CROSSED_METHOD,
    LANGUAGE_CLEAN_KEY,
    LANGUAGE_MONOTONE_KEY,
    LANGUAGE_NOISE_KEY,
    Record,
    crossed_claim,
    exercised,
    mean_of,
    monotone_claim,
    paired_runs,
    points_text,
)
from convergent.studies.descent.config import LANGUAGE_CLAIM_GAMMA
from convergent.studies.descent.measures import sequence_wins
from convergent.studies.engine import CheckSpec
from convergent.studies.framework import Check, Claim, Threshold, at_least, at_most, within

WIN_CLEAN_MARGIN = 0.05  # part (c): the clean win rate within 50 % +- 5 points
WIN_NOISE_MARGIN = 0.05  # part (c): the noisy win rate at least 55 %
PAPER_NOISY_WIN = 0.6993  # the paper's AlpacaEval win rate at gamma 1.5
ERM_FIT_CHECK = (
    "ERM's clean test perplexity over the shared starting checkpoint's (largest over seeds)"
)
ERM_FIT = CheckSpec(
    ERM_FIT_CHECK,
    at_most(1.0),  # ERM's clean test perplexity at most its start's
    "max",
    note="equally good is only worth saying of fine-tunes that learnt something (a "
    "constrained model much worse than ERM shows in the win rate itself)",
    missing="an ERM seed diverged or has no start",
)


def win_rows(
    erm: Sequence[Record], constrained: Sequence[Record], level: int | None = None
) -> list[list[float] | None]:
    """Per seed, per test window: the constrained model's win mark against ERM (1, 0.5 or 0)
    from the final runs' per-window losses, clean (``level`` None) or at the Gaussian level of
    that index; None for a seed without losses (a diverged run)."""
    key = "sequence_losses" if level is None else "noisy_sequence_losses"
    rows: list[list[float] | None] = []
    for e, c in zip(erm, constrained, strict=True):
        if e.get(key) is None or c.get(key) is None:
            rows.append(None)
            continue
        rows.append(sequence_wins(*(r[key] if level is None else r[key][level] for r in (e, c))))
    return rows


def _win_resolution(found: Mapping[str, Any]) -> str:
    half, margin = found["half_width"], found["margin"]
    if not (math.isfinite(half) and found["sentences"]):
        return f" Resolution of the {100 * margin:g}-point margin: n/a (fewer than 2 seeds)."
    return (
        f" Resolution: the interval's half-width is {100 * half:.1f} points over "
        f"{found['sentences']:,} test windows and seeds (seed-level alone "
        f"{100 * found['seed_half_width']:.1f}) against the {100 * margin:g}-point margin: "
        f"{'resolvable' if found['resolvable'] else 'unresolvable'} at this size."
    )


def _win_claim(
    key: str,
    statement: str,
    rows: Sequence[list[float] | None],
    threshold: Threshold,
    margin: float,
    checks: Sequence[Check],
    perplexities: str,
) -> Claim:
    per_seed = [statistics.fmean(row) if row else math.nan for row in rows]
    return crossed_claim(
        statement,
        per_seed,
        [row for row in rows if row],
        threshold,
        margin,
        CROSSED_METHOD.format("windows", "window", "win marks"),
        lambda found: (
            f"win rate per seed {points_text(per_seed)} %; {perplexities}." + _win_resolution(found)
        ),
        key=key,
        unit="win rate (share of test windows where the constrained model's loss is lower "
        "than ERM's, ties half)",
        checks=checks,
    )


def language_claims(language: Mapping[str, Any]) -> list[Claim]:
    """Part (c): the clean and the noisy win rate against ERM, and monotone per-layer losses."""
    erm, constrained = paired_runs(language["runs"])
    checks = exercised(constrained, "language")
    level = [float(g) for g in language["gammas"]].index(LANGUAGE_CLAIM_GAMMA)
    ratios = [
        float(r["perplexity"]) / float(r["start_perplexity"])
        for r in erm
        if r.get("start_perplexity") is not None
    ]
    fits = ERM_FIT.check(ratios if len(ratios) == len(erm) else [])

    def shown(index: int | None) -> str:
        mean = {
            name: statistics.fmean(
                r["perplexity"] if index is None else r["gaussian"][index] for r in records
            )
            for name, records in (("constrained", constrained), ("ERM", erm))
        }
        start = f", start {mean_of(erm, 'start_perplexity'):.2f}" if index is None else ""
        return (
            f"test perplexity constrained {mean['constrained']:.2f}, ERM {mean['ERM']:.2f}{start}"
        )

    window = "the share of test windows on which its loss is lower than ERM's{}, ties half"
    interval = "95 % interval over test windows and seeds"
    noise = f" under noise of RMS {LANGUAGE_CLAIM_GAMMA:g}x the embedding RMS"
    return [
        _win_claim(
            LANGUAGE_CLEAN_KEY,
            "(c) Without noise the descent-constrained fine-tune is judged as good as the "
            f"unconstrained one, a 50 % win rate (here: {window.format('')}, within "
            f"{100 * (0.5 - WIN_CLEAN_MARGIN):g}-{100 * (0.5 + WIN_CLEAN_MARGIN):g} %, {interval}).",
            win_rows(erm, constrained),
            within(0.5 - WIN_CLEAN_MARGIN, 0.5 + WIN_CLEAN_MARGIN),
            WIN_CLEAN_MARGIN,
            [*checks, fits],
            shown(None),
        ),
        _win_claim(
            LANGUAGE_NOISE_KEY,
            f"(c) Under Gaussian embedding noise (gamma {LANGUAGE_CLAIM_GAMMA:g}) the "
            "descent-constrained fine-tune beats the unconstrained one, a "
            f"{100 * PAPER_NOISY_WIN:.2f} % win rate (here: {window.format(noise)}, at least "
            f"{100 * (0.5 + WIN_NOISE_MARGIN):g} %, {interval}).",
            win_rows(erm, constrained, level),
            at_least(0.5 + WIN_NOISE_MARGIN),
            WIN_NOISE_MARGIN,
            checks,
            shown(level),
        ),
        monotone_claim(
            language["runs"],
            "(c)",
            LANGUAGE_MONOTONE_KEY,
            "cross-entropy through the LM head",
            checks,
        ),
    ]
