"""Study ``sparsity``: does HORST train weights that survive pruning (Jacobs, Jain, Burkholz, 2026)?

Claims: at high sparsity (80-90 %) models trained with HORST lose far less accuracy than with
AdamW, and less than with HAM; HORST's weights concentrate near zero.

(a) A small ViT-style classifier (our Transformer on image patches) on Fashion-MNIST, trained
    with AC/DC (global magnitude, straight to the target at each compression) at each target
    sparsity, and dense, with AdamW, HAM (around AdamW) and HORST over the same seeds; top-1
    test accuracy of the final sparse model against the dense baseline.
(b) A small character-level causal Transformer on Jane Austen's novels, trained densely with
    each optimizer, then pruned one-shot layer-wise by magnitude at 50-90 %; validation
    perplexity before and after.

Every optimizer gets the same small learning-rate sweep (dense training, first seed, best
validation score), and the chosen values are reported.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data import load_splits
from ..train import evaluate
from .common import Claim, StudyResult, check_mode
from .sparsity_plots import plot_histograms, plot_sparsity_curves
from .sparsity_runs import (
    OPTIMIZERS,
    OptimizerSettings,
    Recipe,
    RunResult,
    concentration,
    prunable_weights,
    prune_and_score,
    subset,
    train_classifier,
    train_language_model,
)

NEAR_ZERO = 1e-3  # |w| below this counts as "near zero" (weights start at std 0.02)


@dataclass(frozen=True)
class Config:
    """The ``sparsity`` study's settings.

    Attributes:
        mode: ``smoke``, ``quick`` or ``full``.
        seeds: seeds of every run (the lr sweep uses the first).
        optimizers: among ``adamw``, ``ham``, ``horst``.
        learning_rates: the sweep, the same for each optimizer.
        sparsities: AC/DC targets for the classifier.
        lm_sparsities: one-shot targets for the language model.
        image_size, patch: Fashion-MNIST resized to ``image_size`` and cut into patches.
        vit_d_model, vit_layers, vit_heads, vit_d_ff: the classifier's shape.
        vit_steps, vit_batch_size: classifier training.
        train_examples: training images used (None: all 55,000).
        validation_examples, test_examples: evaluation subsets (None: all).
        lm_seq_len, lm_d_model, lm_layers, lm_heads, lm_d_ff: the language model.
        lm_steps, lm_batch_size: language-model training.
        lm_validation_windows: validation windows scored for perplexity (None: all).
        weight_decay, horst_alpha, horst_beta, ham_alpha, ham_beta: shared hyperparameters.
        threads: torch threads during the run (restored after); None leaves them alone. The
            models are tiny: one thread is as fast as two, and much faster on a busy machine.
    """

    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    optimizers: tuple[str, ...] = OPTIMIZERS
    learning_rates: tuple[float, ...] = (1e-3, 3e-3)
    sparsities: tuple[float, ...] = (0.7, 0.8, 0.9)
    lm_sparsities: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    image_size: int = 14
    patch: int = 7
    vit_d_model: int = 64
    vit_layers: int = 2
    vit_heads: int = 4
    vit_d_ff: int = 128
    vit_steps: int = 300
    vit_batch_size: int = 128
    train_examples: int | None = None
    validation_examples: int | None = 2000
    test_examples: int | None = 5000
    lm_seq_len: int = 64
    lm_d_model: int = 64
    lm_layers: int = 2
    lm_heads: int = 4
    lm_d_ff: int = 128
    lm_steps: int = 300
    lm_batch_size: int = 32
    lm_validation_windows: int | None = 256
    weight_decay: float = 0.05
    horst_alpha: float = 1.0
    horst_beta: float = 0.0
    ham_alpha: float = 200.0
    ham_beta: float = 1e-3
    threads: int | None = 1

    def __post_init__(self) -> None:
        check_mode(self.mode)
        unknown = sorted(set(self.optimizers) - set(OPTIMIZERS))
        if unknown:
            raise ValueError(f"optimizers must be among {', '.join(OPTIMIZERS)}, got {unknown}")
        for value in (*self.sparsities, *self.lm_sparsities):
            if not 0.0 < value < 1.0:
                raise ValueError(f"every sparsity must be in (0, 1), got {value}")
        if not self.seeds or not self.learning_rates:
            raise ValueError("seeds and learning_rates must each hold at least one value")

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        """smoke: seconds, for CI; quick: < 5 min on 2 cores; full: several seeds, spread."""
        check_mode(mode)
        if mode == "smoke":
            return cls(mode=mode, learning_rates=(3e-3,), sparsities=(0.8,),
                       lm_sparsities=(0.5, 0.9), vit_d_model=32, vit_d_ff=64, vit_steps=20,
                       vit_batch_size=64, train_examples=2000, validation_examples=200,
                       test_examples=500, lm_seq_len=32, lm_d_model=32, lm_d_ff=64,
                       lm_steps=20, lm_batch_size=16, lm_validation_windows=32)  # fmt: skip
        if mode == "quick":
            return cls(mode=mode)
        # About an hour on 2 cores: 42 classifier runs and 15 language-model runs.
        return cls(mode=mode, seeds=(0, 1, 2), learning_rates=(1e-3, 2e-3, 4e-3),
                   image_size=28, vit_steps=1500, validation_examples=5000,
                   test_examples=None, lm_d_model=128, lm_d_ff=256, lm_steps=1500,
                   lm_validation_windows=1024)  # fmt: skip


def _settings(config: Config) -> OptimizerSettings:
    return OptimizerSettings(config.weight_decay, config.horst_alpha, config.horst_beta,
                             config.ham_alpha, config.ham_beta)  # fmt: skip


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def _spread(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.stdev(finite) if len(finite) > 1 else math.nan


def _key(target: float) -> str:
    return f"{round(target * 100)}%"


def run_classifier(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """Part (a): the lr sweep (dense), then dense and AC/DC runs for every seed."""
    splits = load_splits("fashion-mnist", seed=0, size=config.image_size, patch=config.patch)
    train = subset(splits.train, config.train_examples)
    validation = subset(splits.validation, config.validation_examples)
    test = subset(splits.test, config.test_examples)
    shape = {"d_model": config.vit_d_model, "n_layers": config.vit_layers,
             "n_heads": config.vit_heads, "d_ff": config.vit_d_ff}  # fmt: skip
    recipe = Recipe(_settings(config), shape, config.vit_steps, config.vit_batch_size)
    first_seed = config.seeds[0]

    def test_accuracy(result: RunResult | None) -> float:
        return evaluate(result.model, test, "classification")["accuracy"] if result else math.nan

    sweep: dict[str, dict[float, float]] = {}
    chosen: dict[str, float] = {}
    accuracy: dict[str, dict[str, list[float]]] = {}
    achieved: dict[str, dict[str, list[float]]] = {}
    dense_models: dict[str, nn.Module] = {}
    for name in config.optimizers:
        first: dict[float, RunResult | None] = {}
        for lr in config.learning_rates:
            first[lr] = train_classifier(splits, train, validation, recipe, name, lr, first_seed)
        sweep[name] = {lr: r.validation["accuracy"] if r else math.nan for lr, r in first.items()}
        log(
            f"(a) sweep {name}: "
            + ", ".join(f"lr {k:g} -> {v:.4f}" for k, v in sweep[name].items())
        )
        scored = {lr: v for lr, v in sweep[name].items() if math.isfinite(v)}
        lr = chosen[name] = (
            max(scored, key=scored.__getitem__) if scored else config.learning_rates[0]
        )
        accuracy[name] = {"dense": []}
        achieved[name] = {}
        for seed in config.seeds:
            if seed == first_seed:
                dense = first[lr]
                if dense is not None:
                    dense_models[name] = dense.model
            else:
                dense = train_classifier(splits, train, validation, recipe, name, lr, seed)
            accuracy[name]["dense"].append(test_accuracy(dense))
            for target in config.sparsities:
                result = train_classifier(splits, train, validation, recipe, name, lr, seed, target)
                accuracy[name].setdefault(_key(target), []).append(test_accuracy(result))
                achieved[name].setdefault(_key(target), []).append(
                    result.sparsity if result else math.nan
                )
                log(f"(a) {name} seed {seed} AC/DC {_key(target)}: test accuracy "
                    f"{accuracy[name][_key(target)][-1]:.4f}")  # fmt: skip
    return {"sweep": sweep, "chosen_lr": chosen, "accuracy": accuracy, "achieved": achieved,
            "dense_models": dense_models, "examples": {"train": len(train),
            "validation": len(validation), "test": len(test)}}  # fmt: skip


def run_language_model(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """Part (b): the lr sweep, dense training per seed, one-shot pruning at each sparsity."""
    splits = load_splits("austen", seq_len=config.lm_seq_len)
    validation = subset(splits.validation, config.lm_validation_windows)
    shape = {"d_model": config.lm_d_model, "n_layers": config.lm_layers,
             "n_heads": config.lm_heads, "d_ff": config.lm_d_ff}  # fmt: skip
    recipe = Recipe(_settings(config), shape, config.lm_steps, config.lm_batch_size)
    first_seed = config.seeds[0]
    sweep: dict[str, dict[float, float]] = {}
    chosen: dict[str, float] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    models: dict[str, nn.Module] = {}
    for name in config.optimizers:
        first: dict[float, RunResult | None] = {}
        for lr in config.learning_rates:
            first[lr] = train_language_model(splits, splits.train, validation, recipe, name, lr,
                                             first_seed)  # fmt: skip
        sweep[name] = {lr: r.validation["perplexity"] if r else math.nan for lr, r in first.items()}
        log(
            f"(b) sweep {name}: "
            + ", ".join(f"lr {k:g} -> {v:.3f}" for k, v in sweep[name].items())
        )
        scored = {lr: v for lr, v in sweep[name].items() if math.isfinite(v)}
        lr = chosen[name] = (
            min(scored, key=scored.__getitem__) if scored else config.learning_rates[0]
        )
        curves[name] = {_key(target): [] for target in (0.0, *config.lm_sparsities)}
        for seed in config.seeds:
            result = first[lr] if seed == first_seed else train_language_model(
                splits, splits.train, validation, recipe, name, lr, seed)  # fmt: skip
            if result is None:
                for values in curves[name].values():
                    values.append(math.nan)
                continue
            if seed == first_seed:
                models[name] = result.model
            curves[name]["0%"].append(result.validation["perplexity"])
            for row in prune_and_score(result.model, validation, config.lm_sparsities):
                curves[name][_key(row["target"])].append(row["perplexity"])
            log(f"(b) {name} seed {seed}: perplexity " + ", ".join(
                f"{k} {v[-1]:.3f}" for k, v in curves[name].items()))  # fmt: skip
    return {"sweep": sweep, "chosen_lr": chosen, "perplexity": curves, "models": models,
            "windows": {"train": len(splits.train), "validation": len(validation)}}  # fmt: skip


def _tables(config: Config, vision: dict[str, Any], language: dict[str, Any]) -> dict[str, list]:
    full = len(config.seeds) > 1
    rows = []
    for name in config.optimizers:
        row: dict[str, Any] = {"optimizer": name, "lr": vision["chosen_lr"][name]}
        for key, values in vision["accuracy"][name].items():
            row[f"top-1 {key}"] = _mean(values)
            if full:
                row[f"± {key}"] = _spread(values)
        rows.append(row)
    lm_rows = []
    for name in config.optimizers:
        row = {"optimizer": name, "lr": language["chosen_lr"][name]}
        for key, values in language["perplexity"][name].items():
            row[f"ppl {key}"] = _mean(values)
            if full:
                row[f"± {key}"] = _spread(values)
        lm_rows.append(row)
    sweep_rows = [
        {"optimizer": name, "lr": lr, "(a) validation accuracy": vision["sweep"][name][lr],
         "(b) validation perplexity": language["sweep"][name][lr]}
        for name in config.optimizers for lr in config.learning_rates
    ]  # fmt: skip
    return {
        "(a) Fashion-MNIST ViT, AC/DC: top-1 test accuracy (0 % = dense)": rows,
        "(b) Austen character LM, one-shot layer-wise pruning: validation perplexity": lm_rows,
        "Learning-rate sweep (dense, first seed)": sweep_rows,
    }


def _drops(config: Config, vision: dict[str, Any], name: str) -> float:
    """The mean top-1 lost to AC/DC at the sparsities >= 80 %."""
    dense = _mean(vision["accuracy"][name]["dense"])
    high = [_key(s) for s in config.sparsities if s >= 0.8 - 1e-9]
    return _mean([dense - _mean(vision["accuracy"][name][key]) for key in high])


def _claims(config: Config, vision: dict[str, Any], language: dict[str, Any],
            concentrations: dict[str, float]) -> list[Claim]:  # fmt: skip
    decide = config.mode != "smoke"
    have = set(config.optimizers)
    claims = []
    if {"adamw", "horst"} <= have and any(s >= 0.8 for s in config.sparsities):
        horst, adamw = _drops(config, vision, "horst"), _drops(config, vision, "adamw")
        verdict = horst <= 0.5 * adamw if math.isfinite(horst + adamw) else None
        claims.append(Claim(
            "At 80-90 % sparsity HORST loses far less top-1 accuracy than AdamW (here: at most"
            " half of AdamW's loss, AC/DC on Fashion-MNIST)",
            verdict if decide else None,
            f"mean accuracy lost at >= 80 %: HORST {horst:.4f}, AdamW {adamw:.4f}."))  # fmt: skip
    if {"ham", "horst"} <= have and any(s >= 0.8 for s in config.sparsities):
        horst, ham = _drops(config, vision, "horst"), _drops(config, vision, "ham")
        verdict = horst < ham if math.isfinite(horst + ham) else None
        claims.append(Claim(
            "At 80-90 % sparsity HORST loses less top-1 accuracy than HAM",
            verdict if decide else None,
            f"mean accuracy lost at >= 80 %: HORST {horst:.4f}, HAM {ham:.4f}."))  # fmt: skip
    if {"adamw", "horst"} <= have:
        key = _key(max(config.lm_sparsities))
        horst = _mean(language["perplexity"]["horst"][key]) / _mean(
            language["perplexity"]["horst"]["0%"]
        )
        adamw = _mean(language["perplexity"]["adamw"][key]) / _mean(
            language["perplexity"]["adamw"]["0%"]
        )
        claims.append(Claim(
            f"One-shot pruning to {key} costs a HORST-trained language model less perplexity"
            " than an AdamW-trained one (ratio after/before)",
            (horst < adamw if math.isfinite(horst + adamw) else None) if decide else None,
            f"perplexity ratio at {key}: HORST {horst:.3f}, AdamW {adamw:.3f}."))  # fmt: skip
        h, a = concentrations.get("horst", math.nan), concentrations.get("adamw", math.nan)
        claims.append(Claim(
            f"HORST's weights concentrate near zero (fraction of prunable weights of magnitude <"
            f" {NEAR_ZERO:g}, dense-trained language model)",
            (h > a if math.isfinite(h + a) else None) if decide else None,
            f"HORST {h:.4f}, AdamW {a:.4f}."))  # fmt: skip
    return claims


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run the study and draw its figures into ``out_dir``."""
    started = time.perf_counter()
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        if progress:
            print(f"[sparsity] {line}", flush=True)

    previous_threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        vision = run_classifier(config, log)
        language = run_language_model(config, log)
    finally:
        torch.set_num_threads(previous_threads)
    weights = {name: prunable_weights(model) for name, model in language["models"].items()}
    concentrations = {name: concentration(w, NEAR_ZERO) for name, w in weights.items()}
    vision_weights = {name: prunable_weights(m) for name, m in vision["dense_models"].items()}
    figures = [
        plot_sparsity_curves(config, vision["accuracy"], language["perplexity"],
                             folder / "sparsity_curves.png"),
        plot_histograms(weights, vision_weights, folder / "weight_histograms.png"),
    ]  # fmt: skip
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
        + ".",
        f"Hyperparameters: weight decay {config.weight_decay} on matrices; HORST alpha "
        f"{config.horst_alpha}, beta {config.horst_beta}; HAM alpha {config.ham_alpha}, beta "
        f"{config.ham_beta} around AdamW; warm-up 5 % then cosine decay. Only the learning "
        "rate is swept; HORST's alpha and HAM's alpha and beta stay at the optimizers' "
        "defaults, so a claim that needs a stronger mirror step would not show here.",
    ]
    if config.mode != "full":
        notes.append(f"{config.mode} mode: one seed and short training, so differences of a"
                     " point or two are within noise; the full mode runs 3 seeds.")  # fmt: skip
    data = {
        "vision": {k: v for k, v in vision.items() if k != "dense_models"},
        "language": {k: v for k, v in language.items() if k != "models"},
        "near_zero_fraction": concentrations,
        "near_zero_threshold": NEAR_ZERO,
    }
    return StudyResult(name="sparsity", mode=config.mode, config=asdict(config),
                       tables=_tables(config, vision, language),
                       claims=_claims(config, vision, language, concentrations),
                       figures=[f.name for f in figures], data=data, notes=notes,
                       seconds=time.perf_counter() - started)  # fmt: skip
