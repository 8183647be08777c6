"""The ``sparsity`` study's run: its three parts, each a selection on validation and final runs.

Claims (:mod:`.claims`): at high sparsity HORST keeps more top-1 accuracy than AdamW
and HAM, loses at most half of AdamW's accuracy at 80-90 %, concentrates its weights near zero
(in the ViT and in the LM), and a HORST-trained language model survives one-shot pruning
(magnitude, Wanda, SparseGPT) better than an AdamW-trained one.

(a) A ViT-style classifier (our Transformer on image patches, mean pooling) on Fashion-MNIST,
    trained with AC/DC (global magnitude, straight to the target at each compression).
    Selection: every optimizer's declared grid (the same number of points: HORST alpha x lr,
    HAM alpha x lr, AdamW lr x weight decay) is trained once with the selection seed at the
    selection sparsity (90 %), and the best validation accuracy is selected. Final runs: each
    selected configuration, trained dense and with AC/DC at 70 / 80 / 90 % from each final
    seed (disjoint from the selection seed), scored once on the test split.
(b) A character-level causal Transformer on Jane Austen's novels, trained densely with HORST
    and AdamW, then pruned one-shot layer-wise by magnitude, Wanda and SparseGPT (the last two
    calibrated on a fixed draw of training windows); selection on validation perplexity after
    magnitude pruning to the largest target among the points whose dense validation
    perplexity is within 10 % of the best dense one (either grid), final seeds scored on test
    windows with every pruner.
(c) Pretrained MiniLM-L6 fine-tuned for sentiment with HORST or AdamW, then pruned one-shot: a
    spec (:mod:`.finetune_config`) and a measure (:mod:`.finetune_runs`). Its units are keyed
    by its own settings, and it runs alone (``convergent reproduce sparsity --full --part c``),
    added to the written results of (a) and (b)
    (:class:`~convergent.studies.framework.PartedStudy`).

The manipulation checks are HORST's and HAM's mirror move relative to their AdamW move,
recorded in every HORST and HAM run; alpha's grid runs from a ratio below 0.2 to far above 1.
Every run is a unit in ``OUT/units`` (resumable) and units run in ``workers`` processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from convergent.studies.engine import Selection, run_finals, run_units, select
from convergent.studies.framework import (
    Advice,
    Measured,
    PilotedStudy,
    Report,
    Sentence,
    Session,
    UnitCache,
    json_ready,
)
from convergent.studies.sparsity.brief import (
    advice,
    brief,
    finetune_advice,
    finetune_brief,
    finetune_sentences,
)
from convergent.studies.sparsity.claims import DESIGN, FAMILIES, claims_from_results
from convergent.studies.sparsity.config import (
    LANGUAGE_CRITERION,
    LANGUAGE_TUNING,
    LM_DENSE_TOLERANCE,
    LM_SELECTION_PRUNER,
    RMS_FRACTION,
    VISION_CRITERION,
    VISION_TUNING,
    Config,
    sparsity_key,
)
from convergent.studies.sparsity.finetune_config import FIGURE, FINETUNE_TUNING, finetune_settings
from convergent.studies.sparsity.finetune_runs import finetune_cache, finetune_part
from convergent.studies.sparsity.pilot import run_pilot
from convergent.studies.sparsity.plots import (
    plot_alpha_sweep,
    plot_finetune,
    plot_histograms,
    plot_sparsity_curves,
)
from convergent.studies.sparsity.report import finetune_tables, study_notes, study_tables
from convergent.studies.sparsity.runs import UNIT_DESIGN, language_run, vision_run
from convergent.studies.sparsity.selection import selections_record
from convergent.studies.sparsity.summary import summary

MIRRORED = ("horst", "ham")  # the optimizers whose runs record a move ratio


def pruned_score_of_good_dense(
    units: list[dict[str, Any]], key: str, tolerance: float = LM_DENSE_TOLERANCE
) -> Callable[[dict[str, Any]], float]:
    """The language models' selection score: validation perplexity after magnitude pruning to
    ``key``, NaN (never selected) for a unit whose dense perplexity exceeds ``tolerance`` x the
    best dense one among ``units`` (every optimizer's grid). Without the bound a strong mirror
    step wins on pruned perplexity with a dense model no one would keep (a HORST LM at twice
    AdamW's dense perplexity)."""
    scores = [u["perplexity"][LM_SELECTION_PRUNER] for u in units]
    dense = [s["0%"] for s in scores if math.isfinite(s["0%"])]
    bound = tolerance * min(dense) if dense else math.nan

    def score(unit: dict[str, Any]) -> float:
        scored = unit["perplexity"][LM_SELECTION_PRUNER]
        return scored[key] if scored["0%"] <= bound else math.nan

    return score


def _vision_part(config: Config, cache: UnitCache, log: Callable[[str], None]) -> dict[str, Any]:
    selection = Selection(
        config.grids(),
        lambda name, point: vision_run(
            config, name, point, config.selection_seed, config.selection_sparsity, final=False
        ),
        lambda _: lambda unit: unit["validation_accuracy"],
        True,
        VISION_CRITERION,
        extension_rounds=config.extension_rounds,
    )
    tunings = select(selection, cache, config.workers, lambda line: log(f"(a) {line}")).tunings
    targets: list[float | None] = [None, *config.sparsities]
    finals = [
        (name, seed, target)
        for name in config.optimizers
        for seed in config.seeds
        for target in targets
    ]
    results = run_units(
        cache,
        [
            vision_run(config, name, tunings[name].selected_point, seed, target, final=True)
            for name, seed, target in finals
        ],
        config.workers,
        log,
    )
    keys = ["dense" if t is None else sparsity_key(t) for t in targets]
    accuracy: dict[str, dict[str, list[float]]] = {
        n: {k: [] for k in keys} for n in config.optimizers
    }
    achieved: dict[str, dict[str, list[float]]] = {
        n: {k: [] for k in keys[1:]} for n in config.optimizers
    }
    mirrored = [name for name in MIRRORED if name in config.optimizers]
    moves: dict[str, dict[str, list[Any]]] = {n: {k: [] for k in keys} for n in mirrored}
    strength: dict[str, list[Any]] = {"horst": []} if "horst" in config.optimizers else {}
    share: dict[str, list[float]] = {n: [] for n in config.optimizers}
    histograms: dict[str, torch.Tensor] = {}
    for (name, seed, target), unit in zip(finals, results, strict=True):
        key = "dense" if target is None else sparsity_key(target)
        accuracy[name][key].append(unit["test_accuracy"])
        if target is None:
            share[name].append(unit["near_zero_share"])
            if name in strength:
                strength[name].append(unit["strength"])
            if seed == config.seeds[0] and unit["histogram"] is not None:
                histograms[name] = unit["histogram"]
        else:
            achieved[name][key].append(unit["achieved_sparsity"])
        if name in moves:
            moves[name][key].append(unit["move_ratio"])
    return {
        **selections_record(tunings, "validation_accuracy", "validation_accuracy"),
        "accuracy": accuracy,
        "achieved": achieved,
        "move_ratio": moves,
        "strength": strength,
        "near_zero_share": share,
        "histograms": histograms,
        "tunings": tunings,
    }


def _language_part(config: Config, cache: UnitCache, log: Callable[[str], None]) -> dict[str, Any]:
    grids = config.language_grids()
    top = sparsity_key(max(config.lm_sparsities))
    selection = Selection(
        grids,
        lambda name, point: language_run(config, name, point, config.selection_seed, False),
        lambda units: pruned_score_of_good_dense(units, top),
        False,
        LANGUAGE_CRITERION,
        extension_rounds=config.extension_rounds,
    )
    selected = select(selection, cache, config.workers, lambda line: log(f"(b) {line}"))
    tunings = selected.tunings
    runs = run_finals(
        cache,
        selected.points(),
        config.seeds,
        lambda name, point, seed: language_run(config, name, point, seed, True),
        config.workers,
        log,
    )
    keys = ["0%", *(sparsity_key(t) for t in config.lm_sparsities)]
    perplexity: dict[str, dict[str, dict[str, list[float]]]] = {
        n: {p: {k: [] for k in keys} for p in config.lm_pruners} for n in grids
    }
    share: dict[str, list[float]] = {n: [] for n in grids}
    moves: dict[str, list[Any]] = {"horst": []} if "horst" in grids else {}
    strength: dict[str, list[Any]] = {"horst": []} if "horst" in grids else {}
    histograms: dict[str, torch.Tensor] = {}
    for name, units in runs.items():
        for seed, unit in zip(config.seeds, units, strict=True):
            for pruner in config.lm_pruners:
                for key in keys:
                    perplexity[name][pruner][key].append(unit["perplexity"][pruner][key])
            share[name].append(unit["near_zero_share"])
            if name in moves:
                moves[name].append(unit["move_ratio"])
                strength[name].append(unit["strength"])
            if seed == config.seeds[0] and unit["histogram"] is not None:
                histograms[name] = unit["histogram"]
    return {
        **selections_record(tunings, "validation_perplexity", "perplexity"),
        "perplexity": perplexity,
        "move_ratio": moves,
        "strength": strength,
        "near_zero_share": share,
        "histograms": histograms,
        "tunings": tunings,
    }


class SparsityStudy:
    """The ``sparsity`` study for the framework (:class:`~convergent.studies.framework.Study`)."""

    name = "sparsity"
    design = DESIGN
    unit_design = UNIT_DESIGN
    config = staticmethod(Config.for_mode)
    families = FAMILIES
    claims_from_results = staticmethod(claims_from_results)
    run_pilot = staticmethod(run_pilot)
    parts: Mapping[str, str] = MappingProxyType(
        {"c": "MiniLM fine-tuned with HORST or AdamW, then pruned one-shot"}
    )

    def summary(self, results: Mapping[str, Any]) -> list[Sentence]:
        return [*summary(results), *finetune_sentences(results)]

    def brief(self, results: Mapping[str, Any]) -> list[Sentence]:
        return [*brief(results), *finetune_brief(results)]

    def advice(self, results: Mapping[str, Any]) -> list[Advice]:
        return [*advice(results), *finetune_advice(results)]

    def reserved_seeds(self, config: Config) -> set[int]:
        return {config.selection_seed}

    def threads(self, config: Config) -> int:
        return config.threads

    def measure(self, config: Config, session: Session) -> Measured:
        """The three parts, each a selection on validation and final runs."""
        vision = _vision_part(config, session.cache, session.log)
        language = _language_part(config, session.cache, session.log)
        finetune = self.measure_part(config, "c", session)
        hidden = ("histograms", "tunings")
        return Measured(
            data={
                "vision": {k: v for k, v in vision.items() if k not in hidden},
                "language": {k: v for k, v in language.items() if k not in hidden},
                **finetune.data,
                "rms_fraction": RMS_FRACTION,
            },
            tuning={
                VISION_TUNING: {name: t.to_json() for name, t in vision["tunings"].items()},
                LANGUAGE_TUNING: {name: t.to_json() for name, t in language["tunings"].items()},
                **finetune.tuning,
            },
            unsaved={
                "histograms": {"vision": vision["histograms"], "language": language["histograms"]}
            },
        )

    def measure_part(self, config: Config, part: str, session: Session) -> Measured:
        """Part (c) alone (the one part whose report needs nothing unsaved from the others):
        its units in their own cache beside the study's (:func:`.finetune_runs.finetune_cache`),
        keyed by part (c)'s settings alone."""
        if part != "c":
            raise ValueError(f"study sparsity runs part 'c' alone, got {part!r}")
        settings = finetune_settings(config)
        cache = finetune_cache(session.cache.folder, settings)
        finetune = finetune_part(settings, cache, session.log)
        session.log(f"(c) {cache.summary()}")
        session.cache.count_in(cache)
        return Measured(
            data={
                "finetune": {
                    "config": json_ready(settings),
                    **{k: v for k, v in finetune.items() if k != "tunings"},
                }
            },
            tuning={
                FINETUNE_TUNING: {name: t.to_json() for name, t in finetune["tunings"].items()}
            },
        )

    def report_part(self, config: Config, part: str, measured: Measured, folder: Path) -> Report:
        """Part (c)'s tables and figure, and the study's notes, from the merged results."""
        finetune = measured.data["finetune"]
        return Report(
            finetune_tables(finetune),
            [plot_finetune(finetune, folder / FIGURE).name],
            study_notes(config, measured.data, measured.tuning),
        )

    def report(self, config: Config, measured: Measured, folder: Path) -> Report:
        data, histograms = measured.data, measured.unsaved["histograms"]
        figures = [
            plot_sparsity_curves(
                config,
                data["vision"]["accuracy"],
                data["language"]["perplexity"],
                folder / "sparsity_curves.png",
            ),
            plot_alpha_sweep(data["vision"]["selection"], folder / "alpha_sweep.png"),
            plot_histograms(
                histograms["vision"], histograms["language"], folder / "weight_histograms.png"
            ),
        ]
        part = self.report_part(config, "c", measured, folder)
        return Report(
            study_tables(config, data) | part.tables,
            [f.name for f in figures] + part.figures,
            part.notes,
        )


STUDY: PilotedStudy = SparsityStudy()  # and a PartedStudy
