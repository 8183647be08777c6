"""Study ``residual``: linear convergence of GD on a one-layer Transformer, and residuals at depth.

Paper: Qin, Zhou and Zhu (2025), on the convergence of gradient descent for Transformers with
residual connections. Claims checked here:

1. Full-batch GD on a one-layer Transformer with residual connections converges linearly.
2. The rate is set by the extreme singular values of the attention output matrix
   (a contraction of order sigma_min^2 / sigma_max^2 per step).
3. Residuals keep sigma_min away from zero where softmax collapses rank.
4. Convergence speeds up as the residual coefficient beta goes from 0 to 1.
5. With depth (2, 6, 10 layers) the advantage of residuals grows.

Part (a) (claims 1-4) is `residual_onelayer`; part (b) (claim 4) is `residual_depth`.
Usage: ``run(Config.for_mode("quick"), out_dir)``; ``convergent reproduce residual`` calls it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from .common import Claim, StudyResult, check_mode
from .residual_depth import DepthRun, train_at_depth
from .residual_onelayer import GradientDescentRun, run_beta_sweep, summarize_run
from .residual_plots import (
    plot_depth_curves,
    plot_loss_curves,
    plot_rate_against_ratio,
    plot_spectra,
)


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
        """smoke: seconds, for CI; quick: < 5 min on 2 cores; full: three seeds."""
        check_mode(mode)
        if mode == "smoke":
            return cls(
                mode="smoke", betas=(0.0, 0.5, 1.0), window=6, examples=16, gd_steps=30,
                spectra_every=10, depths=(1, 2), depth_steps=3, depth_batch_size=4,
                max_length=16, train_examples=32, validation_examples=16,
            )  # fmt: skip
        if mode == "full":
            return cls(
                mode="full", seeds=(0, 1, 2), gd_steps=2000, depth_steps=200,
                train_examples=8000, validation_examples=1000,
            )  # fmt: skip
        return cls(mode="quick")

    @property
    def resolved_init_std(self) -> float:
        """``init_std``, or 1 / sqrt(d_model) when it is None."""
        return self.init_std if self.init_std is not None else 1.0 / math.sqrt(self.d_model)


def _spearman(first: Sequence[float], second: Sequence[float]) -> float:
    if len(first) < 2 or not all(map(math.isfinite, [*first, *second])):
        return math.nan
    if np.ptp(first) == 0 or np.ptp(second) == 0:
        return math.nan
    return float(stats.spearmanr(first, second).statistic)


def _mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def _beta_table(rows: list[dict[str, Any]], late: dict[tuple, dict[str, Any]]) -> list[dict]:
    table = []
    for beta in sorted({row["beta"] for row in rows}):
        chosen = [row for row in rows if row["beta"] == beta]
        rate, rate_spread = _mean_and_spread([row["rate"] for row in chosen])
        late_rate, _ = _mean_and_spread([late[(row["seed"], beta)]["rate"] for row in chosen])
        entry: dict[str, Any] = {"beta": beta, "seeds": len(chosen)}
        entry["final_loss"] = float(np.mean([row["final_loss"] for row in chosen]))
        entry["rate (full curve)"] = rate
        if len(chosen) > 1:
            entry["rate sd over seeds"] = rate_spread
        else:
            entry["rate 95% interval"] = (
                f"[{chosen[0]['rate_low']:.5f}, {chosen[0]['rate_high']:.5f}]"
            )
        entry["r_squared"] = float(np.mean([row["r_squared"] for row in chosen]))
        entry["rate (late window)"] = late_rate
        entry["effective rate"] = float(np.mean([row["effective_rate"] for row in chosen]))
        for key, label in (
            ("sigma_min_mean", "sigma_min A"),
            ("sigma_max_mean", "sigma_max A"),
            ("residual_sigma_min_mean", "sigma_min bX+A"),
            ("residual_sigma_max_mean", "sigma_max bX+A"),
            ("residual_squared_ratio_mean", "(min/max)^2 bX+A"),
            ("squared_ratio_mean", "(min/max)^2 A"),
        ):
            entry[label] = float(np.mean([row[key] for row in chosen]))
        table.append(entry)
    return table


def _part_a_claims(table: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[Claim]:
    betas = [row["beta"] for row in table]
    contraction = [1.0 - row["rate (full curve)"] for row in table]
    late_contraction = [1.0 - row["rate (late window)"] for row in table]
    effective_contraction = [1.0 - row["effective rate"] for row in table]
    ratio = [row["(min/max)^2 bX+A"] for row in table]
    plain_ratio = [row["(min/max)^2 A"] for row in table]
    residual_rows = [row for row in rows if row["beta"] > 0]
    linear = all(
        row["rate_high"] < 1 and row["r_squared"] >= 0.9 and not row["diverged"]
        for row in residual_rows
    )
    worst_r2 = min((row["r_squared"] for row in residual_rows), default=math.nan)
    claims = [
        Claim(
            "Full-batch GD on a one-layer Transformer with residual connections converges linearly.",
            linear,
            f"for every beta > 0 and seed, log(loss) against step fits a line with upper rate "
            f"bound < 1: {'yes' if linear else 'no'} (smallest R^2 {worst_r2:.3f}; criterion "
            f"R^2 >= 0.9 over the whole curve).",
        )
    ]
    rho_theory = _spearman(contraction, ratio)
    rho_plain = _spearman(contraction, plain_ratio)
    rho_late = _spearman(late_contraction, ratio)
    rho_effective = _spearman(effective_contraction, ratio)
    same_order = rho_theory == 1.0
    claims.append(
        Claim(
            "The rate is set by sigma_min^2 / sigma_max^2 of the attention output "
            "(the fitted rate orders the same way across beta).",
            same_order if math.isfinite(rho_theory) else None,
            f"Spearman(1 - rho, mean (sigma_min/sigma_max)^2 of beta X + Attn(X)) = "
            f"{rho_theory:.2f} over {len(betas)} betas"
            f"{' (same order)' if same_order else ' (the orders differ)'}; with Attn(X) alone "
            f"{rho_plain:.2f}; with the late-window rate {rho_late:.2f}; with the effective "
            f"rate (L_T/L_0)^(1/T) {rho_effective:.2f} (reported, not the criterion).",
        )
    )
    by_beta = {row["beta"]: row for row in table}
    baseline = by_beta.get(0.0)
    speeds_up = _spearman(betas, contraction)
    if baseline is None:
        claims.append(
            Claim(
                "Residuals keep sigma_min away from zero where softmax collapses rank.",
                None,
                "no beta = 0 run to compare with.",
            )
        )
    else:
        floor = [
            min(r["residual_sigma_min_min"] for r in rows if r["beta"] == beta) for beta in betas
        ]
        zero_floor = floor[betas.index(0.0)]
        kept_away = all(
            value > 10 * zero_floor for beta, value in zip(betas, floor, strict=True) if beta > 0
        )
        collapse = baseline["(min/max)^2 A"]
        claims.append(
            Claim(
                "Residuals keep sigma_min away from zero where softmax collapses rank.",
                kept_away,
                "smallest sigma_min of beta X + Attn(X) over training: "
                + ", ".join(f"beta={b:g}: {v:.2g}" for b, v in zip(betas, floor, strict=True))
                + f" (criterion: every beta > 0 at least 10x beta = 0: "
                f"{'yes' if kept_away else 'no'}); Attn(X) alone: mean (sigma_min/sigma_max)^2 "
                f"= {collapse:.2g} at beta = 0 and "
                f"{by_beta[max(betas)]['(min/max)^2 A']:.2g} at beta = {max(betas):g}.",
            )
        )
    speeds_effective = _spearman(betas, effective_contraction)
    final_losses = [row["final_loss"] for row in table]
    claims.append(
        Claim(
            "Convergence speeds up as beta goes from 0 to 1.",
            speeds_up == 1.0 if math.isfinite(speeds_up) else None,
            f"Spearman(beta, 1 - rho) = {speeds_up:.2f} with the fitted rate (criterion 1.00);"
            f" with the effective rate {speeds_effective:.2f}; final loss by beta: "
            + ", ".join(f"{b:g}: {v:.4f}" for b, v in zip(betas, final_losses, strict=True))
            + ".",
        )
    )
    return claims


def _depth_table(runs: list[DepthRun]) -> list[dict[str, Any]]:
    table = []
    for depth in sorted({run.depth for run in runs}):
        for beta in sorted({run.beta for run in runs}):
            chosen = [run for run in runs if run.depth == depth and run.beta == beta]
            tail = [float(np.mean(run.losses[-max(1, len(run.losses) // 10) :])) for run in chosen]
            loss, loss_spread = _mean_and_spread(tail)
            error, error_spread = _mean_and_spread([run.validation_error for run in chosen])
            row: dict[str, Any] = {
                "depth": depth, "beta": beta, "seeds": len(chosen),
                "final train loss": loss, "validation error": error,
            }  # fmt: skip
            if len(chosen) > 1:
                row["train loss sd"], row["error sd"] = loss_spread, error_spread
            row["initialization"] = chosen[0].initialization
            table.append(row)
    return table


def _depth_claim(table: list[dict[str, Any]]) -> tuple[Claim, list[dict[str, Any]]]:
    gaps = []
    for depth in sorted({row["depth"] for row in table}):
        rows = {row["beta"]: row for row in table if row["depth"] == depth}
        if 0.0 in rows and 1.0 in rows:
            gaps.append(
                {
                    "depth": depth,
                    "loss gap (beta 0 - beta 1)": rows[0.0]["final train loss"]
                    - rows[1.0]["final train loss"],
                    "error gap (beta 0 - beta 1)": rows[0.0]["validation error"]
                    - rows[1.0]["validation error"],
                }
            )
    loss_gaps = [row["loss gap (beta 0 - beta 1)"] for row in gaps]
    grows = len(loss_gaps) >= 2 and all(b > a for a, b in itertools.pairwise(loss_gaps))
    claim = Claim(
        "With depth, the advantage of residuals grows.",
        grows if len(loss_gaps) >= 2 else None,
        "final training-loss gap (beta 0 minus beta 1) by depth: "
        + ", ".join(f"{row['depth']}: {row['loss gap (beta 0 - beta 1)']:.3f}" for row in gaps)
        + f" (criterion: strictly increasing with depth: {'yes' if grows else 'no'}); "
        + "validation-error gaps: "
        + ", ".join(f"{row['depth']}: {row['error gap (beta 0 - beta 1)']:.3f}" for row in gaps)
        + ".",
    )
    return claim, gaps


def _limited_threads(count: int) -> Any:
    """Run tiny-matrix work on ``count`` threads and restore the setting afterwards."""

    class _Threads:
        def __enter__(self) -> None:
            self.previous = torch.get_num_threads()
            torch.set_num_threads(min(count, self.previous))

        def __exit__(self, *exc_info: object) -> None:
            torch.set_num_threads(self.previous)

    return _Threads()


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run parts (a) and (b), write the figures into ``out_dir`` and return the results."""
    started = time.perf_counter()
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log = print if progress else None
    init_std = config.resolved_init_std
    # The one-layer model's matrices are tiny: one thread avoids pure threading overhead.
    with _limited_threads(1):
        gd_runs: list[GradientDescentRun] = run_beta_sweep(
            config.betas, config.seeds, window=config.window, examples=config.examples,
            d_model=config.d_model, d_ff=config.d_ff, init_std=init_std,
            steps=config.gd_steps, lr=config.gd_lr, spectra_every=config.spectra_every, log=log,
        )  # fmt: skip
    rows = [summarize_run(run, 0.0, config.confidence) for run in gd_runs]
    late = {
        (run.seed, run.beta): summarize_run(run, config.late_fit_start, config.confidence)
        for run in gd_runs
    }
    beta_table = _beta_table(rows, late)
    result = StudyResult(name="residual", mode=config.mode, config=replace(config))
    result.tables["(a) one-layer Transformer, full-batch GD on weather-hourly"] = beta_table
    result.claims += _part_a_claims(beta_table, rows)
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
    ]
    if config.run_depth:
        depth_runs = train_at_depth(
            config.depths, config.depth_betas, config.seeds, steps=config.depth_steps,
            batch_size=config.depth_batch_size, lr=config.depth_lr,
            max_length=config.max_length, train_examples=config.train_examples,
            validation_examples=config.validation_examples, log=log,
        )  # fmt: skip
        depth_table = _depth_table(depth_runs)
        claim, gaps = _depth_claim(depth_table)
        result.tables["(b) rt-sentences at depth, with and without residuals"] = depth_table
        result.tables["(b) residual advantage by depth"] = gaps
        result.claims.append(claim)
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
    if config.mode == "smoke":
        result.notes.append("Smoke size: the verdicts mean nothing at this size.")
        result.claims = [replace(claim, reproduced=None) for claim in result.claims]
    result.seconds = time.perf_counter() - started
    return result
