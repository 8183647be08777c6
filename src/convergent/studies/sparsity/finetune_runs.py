"""Part (c)'s measure: fine-tune MiniLM-L6 on rt-sentences, prune a copy per variant, run the
part (the selection on validation, the readout-only run, the final runs on test), and read its
claims and checks off the stored data (:func:`finetune_claims`, from the spec's records).

A unit (:func:`finetune_run`) is one fine-tune (HORST, AdamW, or the readout-only run behind
the "moved" check). A selection run scores the validation sentences dense and after
:data:`~.finetune_config.SELECTION_VARIANT`; a final run marks, for the dense model and each
pruned copy, which test sentences it classifies correctly, and never reads validation. Every
run trains as part (b)'s LM does (5 % warm-up, cosine, decoupled weight decay on matrices, clip
1.0). Part (c)'s units have their own cache (:func:`finetune_cache`), keyed by its config
alone, so it runs (and resumes) on its own.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.data import DictDataset
from convergent.sparse import MaskSpec, prune_one_shot
from convergent.studies.engine import (
    Selection,
    Unit,
    run_finals,
    run_units,
    select,
    training_key,
)
from convergent.studies.framework import (
    Check,
    Claim,
    RtSentences,
    UnitCache,
    correct_per_example,
    crossed_interval,
    finite_mean,
    json_ready,
    margin_resolution,
    mark_differences,
    minilm_classifier,
    rt_sentences,
    with_crossed,
)
from convergent.studies.framework import stored_number as number
from convergent.studies.sparsity import finetune_config as spec
from convergent.studies.sparsity.runs import (
    MOVE_RATIO_RECORDS,
    Recipe,
    fit_recipe,
    study_optimizer,
)
from convergent.studies.sparsity.selection import is_point, selections_record

CALIBRATION_SEED = 0  # the draw of training sentences every pruned copy calibrates on
CALIBRATION_BATCH = 32  # sentences per calibration batch
# Raise it when this code would compute other numbers for the same config.
FINETUNE_UNIT_DESIGN = 1


def move_ratio_records(steps: int) -> int:
    """Move-ratio readings over a fine-tune of ``steps``: 20 (as in part (b)), fewer in a run
    under 80 steps, at most one per 4 steps (a reading costs about two seconds on MiniLM, as
    much as a training step: the quick mode's 20 steps keep 5), and at least 2 (the reading at
    the last step, where the cosine schedule's lr is 0, is NaN and left out of the mean)."""
    return max(2, min(MOVE_RATIO_RECORDS, steps // 4))


@functools.lru_cache(maxsize=2)
def sentence_data(max_length: int, validation: int | None, test: int | None) -> RtSentences:
    """rt-sentences, each evaluation split cut to its first ``validation`` / ``test`` sentences
    (ordered by length), loaded once per process."""
    return rt_sentences(max_length, None, validation, test)


def calibration_batches(train: DictDataset, sentences: int) -> list[dict[str, torch.Tensor]]:
    """The first ``sentences`` of a seeded shuffle of the training split (the same in every
    run), as batches of model inputs without labels."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(CALIBRATION_SEED))
    rows = train.subset(order[:sentences]).tensors
    inputs = {key: value for key, value in rows.items() if key != "labels"}
    return [
        {key: value[start : start + CALIBRATION_BATCH] for key, value in inputs.items()}
        for start in range(0, sentences, CALIBRATION_BATCH)
    ]


def finetune_run(
    config: spec.FinetuneConfig, optimizer: str, point: dict[str, float], seed: int, final: bool
) -> Unit:
    """One fine-tune as a unit (`finetune_unit`): ``optimizer`` is ``"adamw"``, ``"horst"`` or
    ``"readout"`` (AdamW on the head alone); ``final`` runs are scored on test, the others on
    validation only."""
    key = training_key("finetune", point, seed, final, optimizer=optimizer)
    return Unit(key, finetune_unit, (config, optimizer, point, seed, final))


def pruned_copy(
    model: nn.Module, variant: spec.Variant, calibration: list[dict[str, torch.Tensor]]
) -> tuple[nn.Module, float]:
    """A copy of ``model`` pruned one-shot by ``variant``, and its achieved sparsity over the
    pruned matrices."""
    pruned = copy.deepcopy(model)
    masks = MaskSpec(distribution="owl" if variant.owl else "uniform", pattern=variant.pattern)
    calibrated = variant.pruner != "magnitude" or variant.owl
    report = prune_one_shot(
        pruned,
        variant.sparsity,
        spec=masks,
        method=variant.pruner,
        calibration=calibration if calibrated else None,
        keep_masks=False,
    )
    return pruned, report.sparsity


def _accuracy(marks: str) -> float:
    return marks.count("1") / len(marks) if marks else math.nan


def _diverged(seed: int, final: bool, labels: list[str]) -> dict[str, Any]:
    record: dict[str, Any] = {"seed": seed, "move_ratio": math.nan, "diverged": True}
    if final:
        record |= {
            "correct": {label: None for label in ["dense", *labels]},
            "accuracy": {label: math.nan for label in ["dense", *labels]},
            "achieved": {label: math.nan for label in labels},
        }
    else:
        record["validation_accuracy"] = {"dense": math.nan, spec.SELECTION_VARIANT: math.nan}
    return record


def finetune_unit(
    config: spec.FinetuneConfig, optimizer: str, point: dict[str, float], seed: int, final: bool
) -> dict[str, Any]:
    """Fine-tune one run (`finetune_run`) and score it (see the module docstring).

    Returns:
        ``seed``, ``move_ratio`` (HORST's mean over the run; None for AdamW and the readout),
        ``strength`` (HORST's configured first-step ratio; None otherwise) and ``diverged``;
        a selection run adds ``validation_accuracy`` ``{"dense", SELECTION_VARIANT}``; a final
        run ``correct`` (``"0"``/``"1"`` per test sentence, dense and per variant),
        ``accuracy`` (their shares) and ``achieved`` (each variant's sparsity).
    """
    torch.set_num_threads(config.threads)
    data = sentence_data(config.max_length, config.validation_sentences, config.test_sentences)
    chosen = spec.variants(config.variants if final else (spec.SELECTION_VARIANT,))
    model = minilm_classifier(seed, config.layers)
    if optimizer == spec.READOUT:
        model.encoder.requires_grad_(False)
    name = "adamw" if optimizer == spec.READOUT else optimizer
    method = study_optimizer(name, model, config.options(optimizer, point))
    recipe = Recipe(shape={}, steps=config.steps, batch_size=config.batch_size)
    finished, move = fit_recipe(
        model,
        method,
        data.train,
        recipe,
        seed,
        records=move_ratio_records(config.steps),
        task="classification",
        grad_clip=1.0,
        checks=False,  # the recorder reads the move ratio; the live check would read it again
    )
    if not finished:
        return _diverged(seed, final, [variant.label for variant in chosen])
    record: dict[str, Any] = {
        "seed": seed,
        "move_ratio": move,
        "strength": point.get("strength"),
        "diverged": False,
    }
    model.eval()
    scored = data.test if final else data.validation
    marks = {"dense": correct_per_example(model, scored)}
    achieved = {}
    if optimizer != spec.READOUT:
        calibration = calibration_batches(data.train, config.calibration_sentences)
        for variant in chosen:
            pruned, achieved[variant.label] = pruned_copy(model, variant, calibration)
            marks[variant.label] = correct_per_example(pruned, scored)
            del pruned
    accuracy = {label: _accuracy(found) for label, found in marks.items()}
    if not final:
        return record | {"validation_accuracy": accuracy}
    return record | {"correct": marks, "accuracy": accuracy, "achieved": achieved}


def finetune_cache(folder: str | Path, config: spec.FinetuneConfig) -> UnitCache:
    """Part (c)'s unit cache in ``folder`` (a study's ``units`` folder)."""
    return UnitCache(folder, "sparsity.finetune", json_ready(config), design=FINETUNE_UNIT_DESIGN)


def selection_score(unit: dict[str, Any]) -> float:
    """Validation accuracy after the spec's ``SELECTION_VARIANT``; NaN (never selected) for a
    HORST run whose move ratio is below its ``SELECTABLE_MOVE_RATIO``."""
    move = unit["move_ratio"]
    if move is not None and not (math.isfinite(move) and move >= spec.SELECTABLE_MOVE_RATIO):
        return math.nan
    return float(unit["validation_accuracy"][spec.SELECTION_VARIANT])


def finetune_part(
    config: spec.FinetuneConfig, cache: UnitCache, log: Callable[[str], None]
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
        spec.CRITERION,
        extension_rounds=config.extension_rounds,
    )
    selected = select(selection, cache, config.workers, lambda line: log(f"(c) {line}"))
    readout_run = finetune_run(config, spec.READOUT, {}, config.selection_seed, False)
    (readout,) = run_units(cache, [readout_run], 1, log)
    runs = run_finals(
        cache,
        selected.points(),
        config.seeds,
        lambda name, point, seed: finetune_run(config, name, point, seed, True),
        config.workers,
        log,
    )
    sentences = {
        len(marks)
        for listed in runs.values()
        for unit in listed
        for marks in unit.get("correct", {}).values()
        if marks
    }
    return {
        **selections_record(selected.tunings, "validation_accuracy", "validation_accuracy"),
        "readout": {"validation_accuracy": readout["validation_accuracy"]["dense"]},
        "runs": runs,
        "variants": list(config.variants),
        "sentences": max(sentences) if sentences else 0,
        "tunings": selected.tunings,
    }


def _finetune_checks(finetune: Mapping[str, Any], label: str) -> dict[str, Check]:
    """Part (c)'s checks (:data:`.finetune_config.CHECKS`) for the claim at ``label``."""
    horst, adamw = finetune["runs"]["horst"], finetune["runs"]["adamw"]
    ratios = [number(unit["move_ratio"]) for unit in horst]
    readout = number(finetune["readout"]["validation_accuracy"])
    gains = []
    for name, chosen in finetune["selected"].items():
        match = [p for p in finetune["selection"][name] if is_point(p, chosen)]
        gains.append(number(match[0]["validation_accuracy"]["dense"]) if match else math.nan)
    gains = [gain - readout for gain in gains]
    moved = min(gains) if gains and all(math.isfinite(g) for g in gains) else math.nan
    checks = {
        "move": spec.CHECKS["move"].check(
            finite_mean(ratios), runs=", ".join(f"{r:.3g}" for r in ratios)
        ),
        "moved": spec.CHECKS["moved"].check(moved, readout=100 * readout),
    }
    if label != "dense":
        drops = [number(u["accuracy"]["dense"]) - number(u["accuracy"][label]) for u in adamw]
        shown = spec.shown_variant(label)
        checks["room"] = spec.CHECKS["room"].check(finite_mean(drops), shown=shown)
    return checks


def finetune_claims(finetune: Mapping[str, Any]) -> list[Claim]:
    """Part (c)'s claims: the spec's ``DENSE``, then its ``PRUNED`` at each variant."""
    adamw, horst = finetune["runs"]["adamw"], finetune["runs"]["horst"]
    claims = []
    for label in ["dense", *finetune["variants"]]:
        claim_words = spec.DENSE if label == "dense" else spec.PRUNED
        marks = (
            (a["seed"], a["correct"].get(label), h["correct"].get(label))
            for a, h in zip(adamw, horst, strict=True)
        )
        rows = mark_differences(marks, "AdamW", "HORST", f" at {label}")
        per_seed = [statistics.fmean(row) for row in rows]
        crossed = crossed_interval(rows) if len(rows) > 1 else None
        found = margin_resolution(
            per_seed, crossed, len(rows[0]) if rows else None, claim_words.margin
        )
        half = 100 * number(found["half_width"])
        resolved = spec.RESOLVED.format(half=half, sentences=found["sentences"], seeds=len(rows))
        checks = _finetune_checks(finetune, label)
        claim = claim_words.claim(
            per_seed,
            [checks[name] for name in claim_words.checks],
            extra={"variant": label, "resolution": json_ready(found)},
            tag=spec.variant_tag(label),
            shown="" if label == "dense" else spec.shown_variant(label),
            selection=spec.SELECTION,
            survives=spec.SURVIVES if label == spec.STRONGER else "",
            resolved=resolved if math.isfinite(half) else spec.UNRESOLVED,
            horst=_accuracies(horst, label),
            adamw=_accuracies(adamw, label),
        )
        claims.append(with_crossed(claim, crossed, spec.CROSSED))
    return claims


def _accuracies(units: Sequence[Mapping[str, Any]], label: str) -> str:
    """Each unit's test accuracy at ``label`` in percent, for a claim's evidence."""
    return ", ".join(f"{100 * number(u['accuracy'][label]):.2f}" for u in units)
