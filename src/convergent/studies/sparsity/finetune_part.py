"""Part (c)'s run: the selection on validation, the readout-only run, and the final runs.

Its units have their own :class:`~convergent.studies.framework.UnitCache`, keyed by part (c)'s
config alone (beside parts (a) and (b)'s units, in the same folder), so a change to the other
parts' settings never recomputes a fine-tune, and part (c) can be run (and resumed) on its own
(:func:`finetune_cache`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convergent.studies.engine import Selection, run_finals, run_units, select
from convergent.studies.framework import UnitCache, json_ready
from convergent.studies.sparsity.finetune_config import (
    CRITERION,
    READOUT,
    SELECTABLE_MOVE_RATIO,
    SELECTION_VARIANT,
    FinetuneConfig,
)
from convergent.studies.sparsity.finetune_runs import finetune_run
from convergent.studies.sparsity.selection import selections_record

# The design of part (c)'s units: raise it when its own code would compute other numbers for
# the same config (the library's numbers are fingerprinted).
FINETUNE_UNIT_DESIGN = 1


def finetune_cache(folder: str | Path, config: FinetuneConfig) -> UnitCache:
    """Part (c)'s unit cache in ``folder`` (a study's ``units`` folder)."""
    return UnitCache(folder, "sparsity.finetune", json_ready(config), design=FINETUNE_UNIT_DESIGN)


def selection_score(unit: dict[str, Any]) -> float:
    """The selection criterion: validation accuracy after :data:`SELECTION_VARIANT`; NaN (never
    selected) for a HORST run whose move ratio is below :data:`SELECTABLE_MOVE_RATIO`."""
    move = unit["move_ratio"]
    if move is not None and not (math.isfinite(move) and move >= SELECTABLE_MOVE_RATIO):
        return math.nan
    return float(unit["validation_accuracy"][SELECTION_VARIANT])


def finetune_part(
    config: FinetuneConfig, cache: UnitCache, log: Callable[[str], None]
) -> dict[str, Any]:
    """Select each optimizer's point, run the readout-only fine-tune and the final runs.

    Returns:
        What ``results.json`` keeps under ``data["finetune"]`` (``selected``, ``selection``,
        ``readout``, ``runs``: each optimizer's final records in seed order, ``variants``,
        ``sentences``), plus ``tunings`` (the selection objects, not stored).
    """
    selection = Selection(
        config.grids(),
        lambda name, point: finetune_run(config, name, point, config.selection_seed, False),
        lambda _: selection_score,
        True,
        CRITERION,
        extension_rounds=config.extension_rounds,
    )
    selected = select(selection, cache, config.workers, lambda line: log(f"(c) {line}"))
    tunings = selected.tunings
    (readout,) = run_units(
        cache, [finetune_run(config, READOUT, {}, config.selection_seed, False)], 1, log
    )
    runs = run_finals(
        cache,
        selected.points(),
        config.seeds,
        lambda name, point, seed: finetune_run(config, name, point, seed, True),
        config.workers,
        log,
    )
    results = [unit for listed in runs.values() for unit in listed]
    sentences = {
        len(marks) for unit in results for marks in unit.get("correct", {}).values() if marks
    }
    return {
        **selections_record(tunings, "validation_accuracy", "validation_accuracy"),
        "readout": {"validation_accuracy": readout["validation_accuracy"]["dense"]},
        "runs": runs,
        "variants": list(config.variants),
        "sentences": max(sentences) if sentences else 0,
        "tunings": tunings,
    }
