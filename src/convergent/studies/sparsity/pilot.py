"""The ``sparsity`` study's regime pilot: where does a tuned AdamW lose accuracy to AC/DC?

A claim that HORST loses less accuracy than AdamW at 90 % sparsity needs a regime where AdamW
loses some. This pilot measures it for a declared list of candidate ViT regimes, on the
validation split and with AdamW only (no HORST or HAM number can steer the choice):

1. AdamW trains with AC/DC to 90 % at each learning rate of :data:`PILOT_LRS` (selection seed,
   weight decay :data:`PILOT_WEIGHT_DECAY`); the best validation accuracy selects the rate,
   as the study's own selection would.
2. AdamW trains dense at that rate; the *drop* is dense minus 90 % validation accuracy.
3. The study uses the first candidate (cheapest first) whose drop is at least
   :data:`PILOT_DROP` (one point above the 3 points the claims check on test, for the seed
   noise). If none reaches it, the pilot says so and the study uses the candidate with the
   largest drop; the claims' own room check on test then decides whether they are tested.

The first candidate is a regime known to leave too little room (a tuned AdamW lost 1.1 points
on test there, in a full run of this study): the pilot's measure must reproduce that failure
for its choice to mean anything.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convergent.studies.framework import UnitCache, json_ready, run_jobs
from convergent.studies.sparsity.config import Config
from convergent.studies.sparsity.runs import UNIT_DESIGN, VisionJob, vision_unit

PILOT_LRS = (2e-3, 4e-3, 8e-3, 1.6e-2)
PILOT_WEIGHT_DECAY = 0.01
PILOT_DROP = 0.04
PILOT_SPARSITY = 0.9

# Declared before the pilot ran, cheapest first. Every candidate: 4 layers, uniform masks,
# 1000 steps of batch 128 on all 55,000 training images, 5,000 validation images.
PILOT_REGIMES: tuple[dict[str, Any], ...] = (
    {"name": "previous (d32, 7x7 patches)", "vit_d_model": 32, "vit_d_ff": 64, "patch": 7},
    {"name": "narrow (d16, 7x7 patches)", "vit_d_model": 16, "vit_d_ff": 32, "patch": 7},
    {"name": "4x4 patches (d32)", "vit_d_model": 32, "vit_d_ff": 64, "patch": 4},
)


def _regime_config(base: Config, regime: dict[str, Any]) -> Config:
    fields = {k: v for k, v in regime.items() if k != "name"}
    return dataclasses.replace(base, **fields)


def run_pilot(
    out_dir: str | Path, workers: int = 2, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run (or resume) the pilot into ``out_dir``: each regime's selected lr, its validation
    accuracy dense and at 90 %, the drop, and the chosen regime's name (None if none)."""
    base = dataclasses.replace(Config.for_mode("full"), workers=workers)
    rows: list[dict[str, Any]] = []
    chosen = None
    for regime in PILOT_REGIMES:
        config = _regime_config(base, regime)
        # Keyed by the regime's whole config: a job names only its optimizer, point and seed.
        cache = UnitCache(
            Path(out_dir) / "units", "sparsity-pilot", json_ready(config), design=UNIT_DESIGN
        )
        sparse = [
            VisionJob(
                config,
                "adamw",
                {"lr": lr, "weight_decay": PILOT_WEIGHT_DECAY},
                config.selection_seed,
                PILOT_SPARSITY,
                final=False,
            )
            for lr in PILOT_LRS
        ]
        scores = [
            unit["validation_accuracy"]
            for unit in run_jobs(cache, sparse, vision_unit, workers, log)
        ]
        finite = [(s, lr) for s, lr in zip(scores, PILOT_LRS, strict=True) if math.isfinite(s)]
        best, lr = max(finite)
        dense_job = dataclasses.replace(sparse[0], point={**sparse[0].point, "lr": lr})
        dense_job = dataclasses.replace(dense_job, sparsity=None)
        (dense_unit,) = run_jobs(cache, [dense_job], vision_unit, 1, log)
        drop = dense_unit["validation_accuracy"] - best
        rows.append(
            {
                **regime,
                "sparse_validation": dict(zip(map(str, PILOT_LRS), scores, strict=True)),
                "selected_lr": lr,
                "dense_validation": dense_unit["validation_accuracy"],
                "drop": drop,
            }
        )
        log(f"pilot {regime['name']}: lr {lr}, drop {drop:.4f}")
        if drop >= PILOT_DROP:
            chosen = regime["name"]
            break
    if chosen is None:
        fallback = max(rows, key=lambda row: row["drop"])["name"]
        log(f"pilot: no regime lost {PILOT_DROP:g}; the largest drop is {fallback}'s")
    else:
        fallback = chosen
    return {"regimes": rows, "chosen": chosen, "used": fallback, "threshold": PILOT_DROP}
