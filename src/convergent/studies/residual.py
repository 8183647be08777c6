"""Study ``residual``: linear convergence of GD on a one-layer Transformer, and residuals at depth.

Paper: Qin, Zhou and Zhu (2025), on the convergence of gradient descent for Transformers with
residual connections. Claims checked here:

1. Full-batch GD on a one-layer Transformer with residual connections converges linearly.
2. The rate is set by the extreme singular values of the attention output matrix
   (a contraction of order sigma_min^2 / sigma_max^2 per step).
3. Residuals keep sigma_min away from zero where softmax collapses rank.
4. Convergence speeds up as the residual coefficient beta goes from 0 to 1.
5. With depth (2, 6, 10 layers) the advantage of residuals grows.

Part (a) (claims 1-4) is `residual_onelayer`; part (b) (claim 5) is `residual_depth`; the
claims are scored in `residual_claims` (one effect per seed, from the stored data alone).
Every (seed, beta) and (seed, depth, beta) run is a unit of `UnitCache`, so a run resumes.
Usage: ``run(Config.for_mode("quick"), out_dir)``; ``convergent reproduce residual`` calls it.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .common import StudyResult, check_mode, json_ready
from .residual_claims import claims_from_results
from .residual_depth import (
    DepthRun,
    depth_run_to_dict,
    load_minilm,
    rt_sentence_data,
    train_one_depth,
)
from .residual_onelayer import (
    GradientDescentRun,
    run_to_dict,
    summarize_run,
    train_one_beta,
    weather_subset,
)
from .residual_plots import (
    plot_depth_curves,
    plot_loss_curves,
    plot_rate_against_ratio,
    plot_spectra,
)
from .residual_tables import beta_table, depth_gap_table, depth_table
from .units import UnitCache

__all__ = ["Config", "claims_from_results", "run"]


@dataclass(frozen=True)
class Config:
    """Settings of the ``residual`` study.

    Attributes:
        mode: ``smoke``, ``quick`` or ``full``.
        seeds: initialization seeds (part a) and init + data-order seeds (part b).
        betas: residual coefficients of part (a).
        window: hours of weather history per example (tokens T).
        examples: training windows used by full-batch GD.
        d_model, d_ff: width of the one-layer model and of its FFN.
        init_std: weight init std; ``None`` means 1 / sqrt(d_model) (variance preserving,
            since the model has no LayerNorm).
        gd_steps: full-batch GD steps.
        gd_lr: GD step size (the same for every beta).
        spectra_every: measure the attention spectra every this many steps.
        late_fit_start: the secondary rate fit uses the curve from this fraction on.
        confidence: level of the rate intervals.
        depths: encoder depths of part (b).
        depth_betas: residual coefficients of part (b).
        depth_steps: AdamW steps per part (b) run (equal for every setting).
        depth_batch_size: examples per part (b) step.
        depth_lr: AdamW learning rate (constant).
        max_length: tokens per sentence.
        train_examples, validation_examples: rt-sentences subset sizes.
        run_depth: run part (b) at all.
    """

    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    betas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    window: int = 12
    examples: int = 64
    d_model: int = 32
    d_ff: int = 64
    init_std: float | None = None
    gd_steps: int = 1000
    gd_lr: float = 0.1
    spectra_every: int = 20
    late_fit_start: float = 0.5
    confidence: float = 0.95
    depths: tuple[int, ...] = (2, 6, 10)
    depth_betas: tuple[float, ...] = (0.0, 1.0)
    depth_steps: int = 60
    depth_batch_size: int = 16
    depth_lr: float = 1e-4
    max_length: int = 32
    train_examples: int = 2000
    validation_examples: int = 256
    run_depth: bool = True

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if not self.seeds:
            raise ValueError("seeds is empty; give at least one seed.")
        for beta in (*self.betas, *self.depth_betas):
            if not 0.0 <= beta <= 1.0:
                raise ValueError(f"beta={beta} is out of range; allowed range is [0, 1].")
        if len(self.betas) < 2:
            raise ValueError(f"betas has {len(self.betas)} value(s); at least 2 are needed.")
        if not 0.0 <= self.late_fit_start < 1.0:
            raise ValueError(
                f"late_fit_start={self.late_fit_start} is out of range; allowed range is [0, 1)."
            )
        for name in ("gd_steps", "spectra_every", "examples", "depth_steps", "depth_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is out of range; it must be >= 1.")
        if self.gd_steps < 4:
            raise ValueError(f"gd_steps={self.gd_steps} is out of range; it must be >= 4.")

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        """smoke: seconds, for CI; quick: < 5 min on 2 cores; full: five seeds."""
        check_mode(mode)
        if mode == "smoke":
            return cls(
                mode="smoke",
                betas=(0.0, 0.5, 1.0),
                window=6,
                examples=16,
                gd_steps=30,
                spectra_every=10,
                depths=(1, 2),
                depth_steps=3,
                depth_batch_size=4,
                max_length=16,
                train_examples=32,
                validation_examples=16,
            )
        if mode == "full":
            return cls(
                mode="full",
                seeds=(0, 1, 2, 3, 4),
                gd_steps=2000,
                depth_steps=200,
                train_examples=8000,
                validation_examples=1000,
            )
        return cls(mode="quick")

    @property
    def resolved_init_std(self) -> float:
        """``init_std``, or 1 / sqrt(d_model) when it is None."""
        return self.init_std if self.init_std is not None else 1.0 / math.sqrt(self.d_model)


def _limited_threads(count: int) -> Any:
    """Run tiny-matrix work on ``count`` threads and restore the setting afterwards."""

    class _Threads:
        def __enter__(self) -> None:
            self.previous = torch.get_num_threads()
            torch.set_num_threads(min(count, self.previous))

        def __exit__(self, *exc_info: object) -> None:
            torch.set_num_threads(self.previous)

    return _Threads()


def _one_layer_runs(
    config: Config, units: UnitCache, log: Callable[[str], None] | None
) -> list[GradientDescentRun]:
    """Part (a): one cached unit per (seed, beta); the data subset is loaded only if a unit
    has to be computed."""
    weather = functools.cache(lambda: weather_subset(config.window, config.examples, 0))
    runs = []
    # The one-layer model's matrices are tiny: one thread avoids pure threading overhead.
    with _limited_threads(1):
        for seed in config.seeds:
            for beta in config.betas:

                def compute(beta: float = beta, seed: int = seed) -> dict[str, Any]:
                    inputs, labels, _ = weather()
                    run = train_one_beta(
                        inputs,
                        labels,
                        beta,
                        seed,
                        window=config.window,
                        d_model=config.d_model,
                        d_ff=config.d_ff,
                        init_std=config.resolved_init_std,
                        steps=config.gd_steps,
                        lr=config.gd_lr,
                        spectra_every=config.spectra_every,
                    )
                    return run_to_dict(run)

                unit = {"part": "one_layer", "beta": float(beta), "seed": int(seed)}
                run = GradientDescentRun(**units.run(unit, compute))
                if log is not None:
                    log(
                        f"beta={beta} seed={seed}: loss {run.losses[0]:.4f} -> "
                        f"{run.losses[-1]:.4f} in {run.seconds:.1f} s"
                    )
                runs.append(run)
    return runs


def _depth_runs(
    config: Config, units: UnitCache, log: Callable[[str], None] | None
) -> list[DepthRun]:
    """Part (b): one cached unit per (seed, depth, beta); MiniLM and rt-sentences are loaded
    only if a unit has to be computed."""
    from ..data import minilm_path

    pretrained = functools.cache(lambda: load_minilm(minilm_path()))
    sentences = functools.cache(
        lambda: rt_sentence_data(
            config.max_length, config.train_examples, config.validation_examples
        )
    )
    runs = []
    for seed in config.seeds:
        for depth in config.depths:
            for beta in config.depth_betas:

                def compute(depth: int = depth, beta: float = beta, seed: int = seed) -> dict:
                    train, validation = sentences()
                    run = train_one_depth(
                        pretrained(),
                        train,
                        validation,
                        depth,
                        beta,
                        seed,
                        steps=config.depth_steps,
                        batch_size=config.depth_batch_size,
                        lr=config.depth_lr,
                    )
                    return depth_run_to_dict(run)

                unit = {
                    "part": "depth",
                    "depth": int(depth),
                    "beta": float(beta),
                    "seed": int(seed),
                }
                run = DepthRun(**units.run(unit, compute))
                if log is not None:
                    log(
                        f"depth={depth} beta={beta} seed={seed}: final loss {run.losses[-1]:.3f},"
                        f" validation error {run.validation_error:.3f} ({run.seconds:.0f} s)"
                    )
                runs.append(run)
    return runs


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run parts (a) and (b), write the figures into ``out_dir`` and return the results.

    Each (seed, beta) run of part (a) and (seed, depth, beta) run of part (b) is a unit kept
    in ``out_dir / "units"``: a rerun reuses the finished ones.
    """
    started = time.perf_counter()
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log = print if progress else None
    init_std = config.resolved_init_std
    units = UnitCache(folder / "units", "residual", json_ready(config))
    gd_runs = _one_layer_runs(config, units, log)
    rows = [summarize_run(run, 0.0, config.confidence) for run in gd_runs]
    late = {
        (run.seed, run.beta): summarize_run(run, config.late_fit_start, config.confidence)
        for run in gd_runs
    }
    result = StudyResult(name="residual", mode=config.mode, config=replace(config))
    result.tables["(a) one-layer Transformer, full-batch GD on weather-hourly"] = beta_table(
        rows, late
    )
    result.figures += [
        plot_loss_curves(gd_runs, folder / "residual_loss_curves.png").name,
        plot_spectra(gd_runs, folder / "residual_spectra.png").name,
        plot_rate_against_ratio(rows, folder / "residual_rate_vs_ratio.png").name,
    ]
    result.data["one_layer_runs"] = [vars(run) for run in gd_runs]
    result.data["one_layer_fits"] = {"full_curve": rows, "late_window": list(late.values())}
    result.notes += [
        f"(a) One block (single-head softmax attention + GELU FFN of width {config.d_ff}, "
        f"residual beta on both sublayers, no LayerNorm), d_model = {config.d_model}, init "
        f"N(0, {init_std:.3g}^2) (1/sqrt(d_model): variance preserving without a norm), the "
        f"same init seed for every beta (seeds vary the init only). Data: {config.examples} "
        f"training windows drawn once at random (data seed 0) of {config.window} hours of weather-hourly (standardized), target the next hour's "
        f"variables, read out from the last token. Full-batch GD (SGD, no momentum) with step "
        f"size {config.gd_lr} for {config.gd_steps} steps.",
        "Rates: log(loss) regressed on the step over the whole curve (the theorem's form "
        f"L_t <= rho^t L_0), with a {config.confidence:.0%} t-interval; this is the rate the "
        "verdicts use. Reported beside it: the late-window rate (from "
        f"{config.late_fit_start:.0%} of the run on) and the effective rate (L_T/L_0)^(1/T). "
        "The loss is fitted without a floor, so a curve that levels off gets a rate near 1.",
        "Spectra: singular values of the T x d matrices Attn(X) (after the output projection, "
        "before the residual) and beta X + Attn(X), per example over the training subset, "
        f"averaged over examples and over the measurements (every {config.spectra_every} steps).",
        "Claims: every effect is one number per seed (claims 2 and 4: a Spearman over the "
        "betas within each seed), with a 95 % t-interval over the seeds.",
    ]
    if config.run_depth:
        depth_runs = _depth_runs(config, units, log)
        depth_rows = depth_table(depth_runs)
        result.tables["(b) rt-sentences at depth, with and without residuals"] = depth_rows
        result.tables["(b) residual advantage by depth"] = depth_gap_table(depth_rows)
        result.figures.append(plot_depth_curves(depth_runs, folder / "residual_depth.png").name)
        result.data["depth_runs"] = [vars(run) for run in depth_runs]
        result.notes.append(
            "(b) MiniLM-L6 (pretrained) with its layer list cut to the depth (first layers "
            "kept) or, for depth > 6, all six pretrained layers plus freshly initialized BERT "
            "layers (N(0, 0.02) weights) on top; beta scales the residual input inside both "
            "sublayer outputs of every layer: LayerNorm(dropout(dense(h)) + beta x). Mean "
            f"pooling and a new linear head; word embeddings frozen (in every setting, to save "
            f"time); AdamW at constant lr {config.depth_lr}, no weight decay, batch "
            f"{config.depth_batch_size}, {config.depth_steps} steps, the same batches for every "
            f"setting; {config.train_examples} training and {config.validation_examples} "
            f"validation sentences of at most {config.max_length} tokens. 'Final train loss' is "
            "the mean over the last 10 % of steps."
        )
    else:
        result.notes.append("(b) was not run (run_depth=False).")
    # New runs and committed results are scored by the same function, from the stored data.
    result.claims = claims_from_results(
        {"config": json_ready(config), "data": json_ready(result.data)}
    )
    if config.mode == "smoke":
        result.notes.append("Smoke size: one seed, so every verdict is a preview.")
    result.notes.append(f"Units: {units.summary()}.")
    result.seconds = time.perf_counter() - started
    return result
