"""Study ``descent``: layer-wise descent constraints against ERM (Porras-Valenzuela, Hadou,
Ribeiro, 2026, "A Constrained Optimization Perspective of Unrolled Transformers").

(a) MiniLM-L6 fine-tuned on rt-sentences, ERM against descent-constrained (same AdamW,
schedule, steps and seeds): clean test accuracy, accuracy under Gaussian, uniform and
discrete token-embedding perturbations at several levels, per-layer test losses and the
fraction of layer constraints satisfied on test data.
(b) An unrolled Transformer denoiser on patches of street-video frames, trained at one
noise level: test RMSE at noise levels up to 3x the training level, and per-layer losses.

Each (part, method, seed) run is one unit kept in ``OUT/units/``: an interrupted run resumes
where it stopped. The claims are scored in :mod:`.descent_claims` from the stored numbers.

Run with ``convergent reproduce descent [--quick | --smoke]``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import load_street_video
from . import descent_parts as parts
from .common import StudyResult, check_mode, json_ready
from .descent_claims import claims_from_results
from .descent_report import draw_figures, text_tables, video_tables
from .units import UnitCache


@dataclass(frozen=True)
class Config:
    """Every setting of the study; ``for_mode`` gives the three standard sizes.

    Attributes:
        mode: ``"smoke"``, ``"quick"`` or ``"full"``.
        seeds: one model pair per seed (the split is fixed, seed 0).
        alpha: the required relative decrease per layer, alpha_l = alpha.
        dual_lr: eta_d of the SGD dual ascent, every step.
        resilient_cost: c of the resilient relaxation (None: hard constraints).
        text_layers: MiniLM layers kept (None: all 6; smoke keeps 2).
        max_length: tokens per sentence.
        train_examples / test_examples: cut the rt-sentences splits (None: all).
        text_steps, text_batch_size, text_lr: part (a) training.
        additive_gammas: levels of the Gaussian and uniform perturbations (x embedding RMS).
        discrete_gammas: replacement probabilities of the discrete perturbation.
        video_frames: frames decoded from the start of the video; the first 75 % give
            training crops, the last 25 % test crops (different moments of the street).
        crop, patch: crop side and token side in pixels ((crop / patch) ** 2 tokens).
        train_crops / test_crops: examples of part (b).
        denoiser_layers, denoiser_width: the unrolled denoiser's depth and d_model.
        video_steps, video_batch_size, video_lr: part (b) training.
        train_noise: sigma of the training noise (pixels in [0, 1]).
        noise_multiples: test noise levels as multiples of ``train_noise``.
    """

    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    alpha: float = 0.05
    dual_lr: float = 0.5
    resilient_cost: float | None = 10.0
    text_layers: int | None = None
    max_length: int = 48
    train_examples: int | None = None
    test_examples: int | None = 256
    text_steps: int = 100
    text_batch_size: int = 32
    text_lr: float = 1e-4
    additive_gammas: tuple[float, ...] = (0.5, 1.0, 2.0)
    discrete_gammas: tuple[float, ...] = (0.1, 0.2, 0.4)
    video_frames: int = 160
    crop: int = 16
    patch: int = 4
    train_crops: int = 4096
    test_crops: int = 1024
    denoiser_layers: int = 4
    denoiser_width: int = 64
    video_steps: int = 300
    video_batch_size: int = 64
    video_lr: float = 1e-3
    train_noise: float = 0.1
    noise_multiples: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        check_mode(mode)
        if mode == "smoke":
            return cls(
                mode="smoke",
                text_layers=2,
                train_examples=256,
                test_examples=64,
                text_steps=6,
                text_batch_size=16,
                additive_gammas=(1.0,),
                discrete_gammas=(0.2,),
                video_frames=8,
                train_crops=256,
                test_crops=64,
                denoiser_layers=2,
                denoiser_width=32,
                video_steps=10,
                video_batch_size=32,
                noise_multiples=(1.0, 2.0),
            )
        if mode == "full":
            return cls(
                mode="full",
                seeds=(0, 1, 2, 3, 4),
                test_examples=None,
                text_steps=250,
                additive_gammas=(0.25, 0.5, 1.0, 2.0),
                discrete_gammas=(0.05, 0.1, 0.2, 0.4),
                video_frames=400,
                train_crops=16384,
                test_crops=2048,
                video_steps=1500,
            )
        return cls()


def _train(
    model: torch.nn.Module,
    method: str,
    train: Any,
    config: Config,
    *,
    task: str,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    """Train one model; the start of its per-run record (loss and multiplier activity)."""
    training = parts.train_model(
        model,
        method,
        train,
        task=task,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        alpha=config.alpha,
        dual_lr=config.dual_lr,
        resilient_cost=config.resilient_cost,
        progress=progress,
    )
    return {
        "seed": seed,
        "train_loss": training["train_loss"],
        "multipliers": training["multipliers"],
        **parts.multiplier_activity(training["history"]),
    }


def run_text(config: Config, units: UnitCache, progress: bool) -> dict[str, Any]:
    """Part (a): per seed and method, accuracies, robustness and per-layer test losses.

    Each (method, seed) run is one unit of ``units``: a finished one is read back, not rerun.
    """
    train, test, special = parts.text_data(
        config.max_length, config.train_examples, config.test_examples
    )
    levels = {
        "gaussian": config.additive_gammas,
        "uniform": config.additive_gammas,
        "discrete": config.discrete_gammas,
    }

    def compute(method: str, seed: int) -> dict[str, Any]:
        model = parts.text_model(seed, config.text_layers)
        record = _train(
            model,
            method,
            train,
            config,
            task="classification",
            steps=config.text_steps,
            batch_size=config.text_batch_size,
            lr=config.text_lr,
            seed=seed,
            progress=progress,
        )
        record.update(parts.robustness(model, test, levels, special, seed=1000 + seed))
        record.update(parts.layer_report(model, test, "classification", config.alpha))
        return record

    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in parts.METHODS}
    for seed in config.seeds:
        for method in parts.METHODS:
            unit = {"part": "text", "method": method, "seed": seed}
            runs[method].append(units.run(unit, functools.partial(compute, method, seed)))
    return {
        "levels": levels,
        "runs": runs,
        "test_examples": len(test),
        "train_examples": len(train),
    }


def run_video(config: Config, units: UnitCache, progress: bool) -> dict[str, Any]:
    """Part (b): per seed and method, RMSE at each noise level and per-layer test losses.

    Each (method, seed) run is one unit of ``units``: a finished one is read back, not rerun.
    """
    frames = load_street_video(max_frames=config.video_frames)
    split = max(1, int(0.75 * len(frames)))
    train_frames, test_frames = frames[:split], frames[split:] if split < len(frames) else frames
    generator = torch.Generator().manual_seed(0)
    train_clean = parts.video_crops(
        train_frames, config.train_crops, config.crop, config.patch, generator
    )
    test_clean = parts.video_crops(
        test_frames, config.test_crops, config.crop, config.patch, generator
    )
    train = parts.noisy_pairs(train_clean, config.train_noise, seed=1)
    at_training_noise = parts.noisy_pairs(test_clean, config.train_noise, seed=3000)
    sigmas = [m * config.train_noise for m in config.noise_multiples]
    tokens = (config.crop // config.patch) ** 2

    def compute(method: str, seed: int) -> dict[str, Any]:
        model = parts.denoiser(
            seed, config.patch, tokens, config.denoiser_width, config.denoiser_layers
        )
        record = _train(
            model,
            method,
            train,
            config,
            task="regression",
            steps=config.video_steps,
            batch_size=config.video_batch_size,
            lr=config.video_lr,
            seed=seed,
            progress=progress,
        )
        record["rmse"] = parts.denoising_rmse(model, test_clean, sigmas, seed=2000)
        record.update(parts.layer_report(model, at_training_noise, "regression", config.alpha))
        return record

    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in parts.METHODS}
    for seed in config.seeds:
        for method in parts.METHODS:
            unit = {"part": "video", "method": method, "seed": seed}
            runs[method].append(units.run(unit, functools.partial(compute, method, seed)))
    return {"sigmas": sigmas, "runs": runs, "frames": len(frames)}


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run both parts and return the tables, claims, figures and every number."""
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    units = UnitCache(out / "units", "descent", json_ready(config))
    text = run_text(config, units, progress)
    video = run_video(config, units, progress)
    result = StudyResult(name="descent", mode=config.mode, config=config)
    result.tables.update(text_tables(text))
    result.tables.update(video_tables(video, config.noise_multiples))
    result.data = {"text": text, "video": video}
    # The same scoring as a re-score of a written results.json: from its JSON form alone.
    result.claims = claims_from_results(
        {"config": json_ready(config), "data": json_ready(result.data)}
    )
    result.figures = draw_figures(text, video, config.noise_multiples, out)
    model_name = (
        "MiniLM-L6"
        if config.text_layers is None
        else f"MiniLM-L6 cut to {config.text_layers} layers"
    )
    result.notes = [
        f"(a) {model_name}, mean-pooled linear head shared by every layer; "
        f"{text['train_examples']} training sentences available, {config.text_steps} AdamW "
        f"steps of {config.text_batch_size} (lr {config.text_lr}, 10 % warm-up, linear decay, "
        f"clip 1.0), max_length {config.max_length}; {text['test_examples']} test sentences.",
        f"Constraints: f_l <= (1 - {config.alpha}) f_(l-1) for every layer, dual SGD lr "
        f"{config.dual_lr} every step, resilient cost c = {config.resilient_cost}.",
        "Perturbation levels: Gaussian and uniform noise have RMS gamma x the RMS of the "
        "word-embedding matrix (uniform on [-a, a] with a = sqrt(3) gamma RMS); discrete "
        "replaces each token's embedding by a random token's with probability gamma. "
        "Special tokens ([CLS], [SEP], [PAD], ...) are never perturbed. Both models see the "
        "same noise draws.",
        f"(b) {video['frames']} frames of street-video (first 75 % train, last 25 % test), "
        f"{config.crop}x{config.crop} crops as {config.patch}x{config.patch}-pixel tokens, "
        f"pixels in [0, 1], Gaussian noise sigma {config.train_noise} in training; a "
        f"{config.denoiser_layers}-layer pre-norm Transformer (d_model {config.denoiser_width}) "
        f"whose shared head maps every layer to clean pixels; {config.video_steps} steps.",
    ]
    if len(config.seeds) < 3:
        result.notes.append(
            f"{len(config.seeds)} seed(s): every verdict is a preview, not a result."
        )
    result.notes.append(f"Units: {units.summary()}.")
    result.seconds = time.perf_counter() - start
    return result
