"""The ``langevin`` study's regime pilot: which training-set size and width can overfit?

"Without a regularizer the generalization gap creeps up" is testable only where the model can
overfit. This pilot measures, for a declared list of candidate regimes on generated Darcy flow
(``darcy-gen``), how far phase 1 alone (AdamW on every parameter, no Langevin, no regularizer)
overfits: the validation RMSE over the training RMSE. No Langevin run and no test field enters it, so
nothing about the claims can steer the choice.

The study uses the first candidate (cheapest first) whose ratio is at least
:data:`PILOT_OVERFIT`; if none reaches it, the pilot says so and the study uses the candidate
with the largest ratio. The pilot is a unit of the study's cache, run on the selection seed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from convergent.studies.langevin.models import build_model, darcy_pool, pretrain
from convergent.train import evaluate

# Declared before the pilot ran. Every candidate: the first ``train_fields`` of the generated
# pool (`models.darcy_pool`), phase 1 as in the study (AdamW, lr 3e-3, batch 64, the
# config's ``pilot_steps``), one layer, the selection seed; scored on the validation fields.
PILOT_OVERFIT = 1.25
PILOT_REGIMES: tuple[dict[str, Any], ...] = (
    {"name": "200 fields, d_model 16", "train_fields": 200, "d_model": 16},
    {"name": "100 fields, d_model 16", "train_fields": 100, "d_model": 16},
    {"name": "200 fields, d_model 64", "train_fields": 200, "d_model": 64},
    {"name": "100 fields, d_model 64", "train_fields": 100, "d_model": 64},
)


def regime_named(name: str) -> dict[str, Any]:
    """The candidate called ``name``."""
    for regime in PILOT_REGIMES:
        if regime["name"] == name:
            return dict(regime)
    names = ", ".join(repr(regime["name"]) for regime in PILOT_REGIMES)
    raise ValueError(f"regime {name!r} is not a pilot candidate; choose one of {names}.")


def run_pilot(
    steps: int,
    validation_fields: int,
    seed: int,
    log: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Phase 1 of every candidate, then the choice: the first whose validation RMSE / training
    RMSE reaches :data:`PILOT_OVERFIT`, else the one with the largest ratio (said so)."""
    rows: list[dict[str, Any]] = []
    chosen = None
    for regime in PILOT_REGIMES:
        started = time.perf_counter()
        # One test field is generated because the loader needs a test split; it is not read.
        data = darcy_pool(regime["train_fields"], validation_fields, 1)
        tokens, features = data.train.tensors["inputs"].shape[1:]
        model = build_model(1, regime["d_model"], int(tokens), int(features), seed=seed)
        pretrain(model, data.train, steps, 3e-3, 64, seed=seed)
        train_rmse = float(evaluate(model, data.train, "regression")["rmse"])
        validation_rmse = float(evaluate(model, data.validation, "regression")["rmse"])
        ratio = validation_rmse / train_rmse if train_rmse > 0 else math.inf
        row = {
            **regime,
            "train_rmse": train_rmse,
            "validation_rmse": validation_rmse,
            "ratio": ratio,
            "seconds": time.perf_counter() - started,
        }
        rows.append(row)
        if log is not None:
            log(
                f"langevin pilot: {regime['name']}: train RMSE {train_rmse:.4f}, validation "
                f"{validation_rmse:.4f} (ratio {ratio:.2f}) in {row['seconds']:.0f} s"
            )
        if chosen is None and ratio >= PILOT_OVERFIT:
            chosen = regime["name"]
    fallback = chosen is None
    if fallback:
        chosen = max(rows, key=lambda row: row["ratio"])["name"]
    return {
        "criterion": f"validation RMSE / training RMSE after phase 1 >= {PILOT_OVERFIT}",
        "required": PILOT_OVERFIT,
        "rows": rows,
        "chosen": chosen,
        "fallback": fallback,
    }
