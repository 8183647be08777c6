"""The ``langevin`` study's regime pilot: which training-set size and width can overfit?

"Without a regularizer the generalization gap creeps up" is testable only where the model can
overfit: on darcy-16's 900 training fields the first design's gap barely moved. This pilot
measures, for a declared list of candidate regimes on generated Darcy flow (``darcy-gen``), how
far phase 1 alone (AdamW on every parameter, no Langevin, no regularizer) overfits: the
validation RMSE over the training RMSE. No Langevin run and no test field enters it, so
nothing about the claims can steer the choice.

The study uses the first candidate (cheapest first) whose ratio is at least
:data:`PILOT_OVERFIT`; if none reaches it, the pilot says so and the study uses the candidate
with the largest ratio.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .common import json_ready
from .langevin_parts import build_model, pretrain

# Declared before the pilot ran. Every candidate: the first ``train_fields`` of a pool of
# generated 16x16 Darcy fields (pool seed POOL_SEED), 200 validation fields from the same pool,
# phase 1 as in the full mode (AdamW, lr 3e-3, batch 64, 2000 steps), one layer, seed 0.
POOL_SEED = 100
POOL_TRAIN = 2000  # generated; 10 % of it is the validation pool
TEST_FIELDS = 4000  # generated with POOL_SEED + 1 (not read by the pilot)
PILOT_OVERFIT = 1.25
PILOT_STEPS = 2000
PILOT_REGIMES: tuple[dict[str, Any], ...] = (
    {"name": "200 fields, d_model 16", "train_fields": 200, "d_model": 16},
    {"name": "100 fields, d_model 16", "train_fields": 100, "d_model": 16},
    {"name": "200 fields, d_model 64", "train_fields": 200, "d_model": 64},
    {"name": "100 fields, d_model 64", "train_fields": 100, "d_model": 64},
)


def darcy_pool(train_fields: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(train, validation, test, info) of generated Darcy flow, labels as [N, 16, 16] patches.

    Train is the first ``train_fields`` of the pool's training part; validation is the pool's
    (200 fields); test is :data:`TEST_FIELDS` fields generated with another seed.
    """
    from ..data import load_splits
    from ..data.numeric_loaders import to_patches
    from ..data.splits import DictDataset

    splits = load_splits("darcy-gen", seed=POOL_SEED, train_size=POOL_TRAIN, test_size=TEST_FIELDS)
    patch, resolution = int(splits.info["patch"]), int(splits.info["resolution"])

    def reorder(dataset: DictDataset) -> DictDataset:
        labels = dataset.tensors["labels"].view(-1, resolution, resolution)
        return DictDataset(
            {"inputs": dataset.tensors["inputs"], "labels": to_patches(labels, patch)}
        )

    if not 1 <= train_fields <= len(splits.train):
        raise ValueError(
            f"train_fields={train_fields} is out of range; allowed range is [1, "
            f"{len(splits.train)}]."
        )
    train = reorder(splits.train).subset(torch.arange(train_fields))
    return train, reorder(splits.validation), reorder(splits.test), dict(splits.info)


def _rmse(model: torch.nn.Module, dataset: Any) -> float:
    from ..train import evaluate

    return float(evaluate(model, dataset, "regression")["rmse"])


def run_pilot(out_dir: str | Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every candidate (phase 1 only) and pick the regime; writes ``pilot.json``."""
    import json

    rows: list[dict[str, Any]] = []
    chosen = None
    for regime in PILOT_REGIMES:
        started = time.perf_counter()
        train, validation, _, info = darcy_pool(regime["train_fields"])
        tokens, features = train.tensors["inputs"].shape[1:]
        model = build_model(1, regime["d_model"], int(tokens), int(features), seed=0)
        pretrain(model, train, PILOT_STEPS, 3e-3, 64, seed=0)
        train_rmse, validation_rmse = _rmse(model, train), _rmse(model, validation)
        ratio = validation_rmse / train_rmse if train_rmse > 0 else math.inf
        row = {
            **regime,
            "train_rmse": train_rmse,
            "validation_rmse": validation_rmse,
            "ratio": ratio,
            "labels_std": float(info["labels_std"]),
            "seconds": time.perf_counter() - started,
        }
        rows.append(row)
        log(
            f"{regime['name']}: train RMSE {train_rmse:.4f}, validation {validation_rmse:.4f} "
            f"(ratio {ratio:.2f}) in {row['seconds']:.0f} s"
        )
        if chosen is None and ratio >= PILOT_OVERFIT:
            chosen = regime["name"]
    result = {
        "criterion": f"validation RMSE / training RMSE after phase 1 >= {PILOT_OVERFIT}",
        "rows": rows,
        "chosen": chosen,
        "fallback": max(rows, key=lambda row: row["ratio"])["name"] if chosen is None else None,
    }
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pilot.json").write_text(json.dumps(json_ready(result), indent=2) + "\n")
    return result


if __name__ == "__main__":
    import sys

    run_pilot(sys.argv[1] if len(sys.argv) > 1 else "langevin-pilot")
