"""The tables and notes of the ``sparsity`` study's report."""

from __future__ import annotations

import math
import statistics
from typing import Any

from .sparsity_config import Config


def mean_of_finite(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def spread_of_finite(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.stdev(finite) if len(finite) > 1 else math.nan


def study_tables(
    config: Config, vision: dict[str, Any], language: dict[str, Any]
) -> dict[str, list]:
    full = len(config.seeds) > 1
    rows = []
    for name in config.optimizers:
        row: dict[str, Any] = {"optimizer": name, "lr": vision["chosen_lr"][name]}
        for key, values in vision["accuracy"][name].items():
            row[f"top-1 {key}"] = mean_of_finite(values)
            if full:
                row[f"± {key}"] = spread_of_finite(values)
        rows.append(row)
    lm_rows = []
    for name in config.optimizers:
        row = {"optimizer": name, "lr": language["chosen_lr"][name]}
        for key, values in language["perplexity"][name].items():
            row[f"ppl {key}"] = mean_of_finite(values)
            if full:
                row[f"± {key}"] = spread_of_finite(values)
        lm_rows.append(row)
    sweep_rows = [
        {
            "optimizer": name,
            "lr": lr,
            "(a) validation accuracy": vision["sweep"][name][lr],
            "(b) validation perplexity": language["sweep"][name][lr],
        }
        for name in config.optimizers
        for lr in config.learning_rates
    ]
    return {
        "(a) Fashion-MNIST ViT, AC/DC: top-1 test accuracy (0 % = dense)": rows,
        "(b) Austen character LM, one-shot layer-wise pruning: validation perplexity": lm_rows,
        "Learning-rate sweep (dense, first seed)": sweep_rows,
    }


def study_notes(config: Config, vision: dict[str, Any], language: dict[str, Any]) -> list[str]:
    notes = [
        f"(a) Fashion-MNIST resized to {config.image_size}x{config.image_size}, cut into "
        f"{config.patch}x{config.patch} patches ({(config.image_size // config.patch) ** 2} "
        f"tokens of {config.patch**2} pixels); {vision['examples']['train']} training, "
        f"{vision['examples']['validation']} validation and {vision['examples']['test']} test"
        f" images; {config.vit_steps} steps of batch {config.vit_batch_size}.",
        "(a) AC/DC with the paper's ImageNet proportions in steps (10 % dense warm-up, 5 % "
        "phases, 10 % last dense, 15 % final compressed), global magnitude masks over the "
        "attention and feed-forward matrices (the patch projection, positions and head stay "
        "dense), first moments masked at each phase flip.",
        f"(b) Character-level, windows of {config.lm_seq_len}; {config.lm_steps} steps of "
        f"batch {config.lm_batch_size}; perplexity on {language['windows']['validation']} "
        "validation windows; layer-wise (uniform) magnitude pruning of every attention and "
        "feed-forward matrix; the token embedding, positions and the LM head stay dense.",
        "Learning rates: the same sweep for every optimizer on dense training with the first "
        f"seed ({', '.join(f'{lr:g}' for lr in config.learning_rates)}); chosen for (a): "
        + ", ".join(f"{k} {v:g}" for k, v in vision["chosen_lr"].items())
        + "; for (b): "
        + ", ".join(f"{k} {v:g}" for k, v in language["chosen_lr"].items())
        + ". The selected first-seed run is that seed's dense run; the test split is read "
        "once per final model, after the selection.",
        f"Hyperparameters: weight decay {config.weight_decay} on matrices; HORST alpha "
        f"{config.horst_alpha}, beta {config.horst_beta}; HAM alpha {config.ham_alpha}, beta "
        f"{config.ham_beta} around AdamW; warm-up 5 % then cosine decay. Only the learning "
        "rate is swept; HORST's alpha and HAM's alpha and beta stay at the optimizers' "
        "defaults, so a claim that needs a stronger mirror step would not show here.",
        "Manipulation check: HORST's mirror move / Adam move is ||mirror|| / ||theta - "
        "theta_half|| of the step its current moments would take next (convergent.optim."
        "horst_move_ratio), recorded every max(1, steps // 20) steps of every HORST run and "
        "averaged per run; at alpha 1 it is about the typical |w|, so the check asks whether "
        "the mirror step does anything an AdamW step would not.",
    ]
    if config.mode != "full":
        notes.append(
            f"{config.mode} mode: one seed and short training, so differences of a"
            " point or two are within noise; the full mode runs 5 seeds."
        )
    return notes
