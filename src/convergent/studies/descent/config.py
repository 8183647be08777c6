"""The ``descent`` study's settings: the parts, the declared grids, the selection rule, seeds.

Both methods of a part get a grid of the same size, trained with the selection seed and
scored on the validation split only. ERM goes first, over learning rate x weight decay (ERM
has no constraint; its two axes are the knobs it has); the constrained model then runs over
resilient cost c (``None``: hard constraints) x the required decrease alpha at the learning
rate and weight decay ERM selected, so the two differ by the constraints alone. The selection
rule is the same for both (:func:`robust_score` on text, :func:`denoising_score` on the
denoiser): the best validation score under the selection shift among the method's points
whose clean validation score is within a tolerance of its own best clean one, so a point
cannot win robustness by giving up clean quality; what the constraints cost in clean quality
is the clean-accuracy claim's to judge, on test.

On the denoiser (design 3) the floor is (1 + tolerance) x the best validation RMSE at the
training noise among the method's points *where its constraints act* on the selection run
(the claims' own checks: largest lambda at least 0.1, some lambda positive in at least 20 % of
the steps), and only those points are selectable; a grid with no such point (ERM's, which has
no constraints, or a constrained grid whose constraints never act) is scored over all its
points. Design 2 took the floor over every constrained point: binding cost more than 1 % RMSE
at the training noise, so the floor removed every point where the constraints acted and the
claims' checks could not pass.

The modes differ only in the values of :data:`PRESETS`; every other field keeps its default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.framework import check_mode, grid_points

METHODS = ("erm", "constrained")


@dataclass(frozen=True)
class Config:
    """Every setting of the study; ``for_mode`` gives the three standard sizes (the
    defaults are the quick mode's: about 5 minutes on 2 cores, previews only).

    Attributes:
        mode: ``"smoke"``, ``"quick"`` or ``"full"``.
        selection_seed: the seed of every grid point (scored on validation only).
        seeds: the final seeds of each selected configuration (scored on test); disjoint
            from ``selection_seed``.
        constrained_costs: the constrained grid's resilient costs c (None: hard).
        constrained_alphas: the constrained grid's required relative decrease per layer.
        erm_lrs, erm_weight_decays: ERM's grid (text part; the video part scales the lrs by
            ``video_lr / text_lr``).
        dual_lr: eta_d of the SGD dual ascent, every step.
        text_lr: the text part's base learning rate (ERM's grid scales it; the constrained
            runs take ERM's selected scale).
        weight_decay: AdamW's decay where no point names one.
        selection_gamma: the Gaussian embedding-noise level of the text selection score.
        clean_tolerance: text: a selectable point's clean validation accuracy is at least its
            method's best one minus this; video: its validation RMSE at the training noise is
            at most (1 + this) x its method's best one.
        text_layers: MiniLM layers kept (None: all 6).
        max_length: tokens per sentence.
        train_examples, validation_examples, test_examples: cut the rt-sentences splits.
        text_steps, text_grid_steps: final and grid runs' AdamW steps (equal in full mode).
        text_batch_size: sentences per step.
        additive_gammas: Gaussian and uniform embedding-noise levels (x embedding RMS).
        discrete_gammas: replacement probabilities of the discrete embedding perturbation.
        typo_rates: per-letter typo probabilities of the test-time character noise.
        dropout_rates: per-word drop probabilities of the test-time word dropout.
        video_frames: frames decoded; the first 60 % give training crops, the next 15 %
            validation crops and the last 25 % test crops (different moments of the street).
        crop, patch: crop side and token side in pixels ((crop / patch) ** 2 tokens).
        train_crops, validation_crops, test_crops: examples of part (b).
        denoiser_layers, denoiser_width: the unrolled denoiser's depth and d_model.
        video_steps, video_grid_steps, video_batch_size, video_lr: part (b) training (the
            grid's steps equal the final runs' in full mode).
        train_noise: sigma of the training noise (pixels in [0, 1]).
        noise_multiples: test noise levels as multiples of ``train_noise``.
        selection_multiple: the noise multiple of the video selection score.
        workers: processes running units side by side (each ``threads`` threads).
        threads: torch threads per process.
    """

    mode: str = "quick"
    selection_seed: int = 0
    seeds: tuple[int, ...] = (1,)
    constrained_costs: tuple[float | None, ...] = (10.0, None)
    constrained_alphas: tuple[float, ...] = (0.2,)
    erm_lrs: tuple[float, ...] = (1e-4,)
    erm_weight_decays: tuple[float, ...] = (0.01, 0.1)
    dual_lr: float = 0.5
    text_lr: float = 1e-4
    weight_decay: float = 0.01
    selection_gamma: float = 1.0
    clean_tolerance: float = 0.01
    text_layers: int | None = None
    max_length: int = 48
    train_examples: int | None = 512
    validation_examples: int | None = 128
    test_examples: int | None = 256
    text_steps: int = 40
    text_grid_steps: int = 20
    text_batch_size: int = 16
    additive_gammas: tuple[float, ...] = (1.0,)
    discrete_gammas: tuple[float, ...] = (0.2,)
    typo_rates: tuple[float, ...] = (0.1,)
    dropout_rates: tuple[float, ...] = (0.2,)
    video_frames: int = 160
    crop: int = 16
    patch: int = 4
    train_crops: int = 1024
    validation_crops: int = 256
    test_crops: int = 256
    denoiser_layers: int = 8
    denoiser_width: int = 64
    video_steps: int = 100
    video_grid_steps: int = 100
    video_batch_size: int = 64
    video_lr: float = 1e-3
    train_noise: float = 0.1
    noise_multiples: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)
    selection_multiple: float = 2.0
    workers: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.selection_seed in self.seeds:
            raise ValueError(
                f"selection_seed {self.selection_seed} is also a final seed; they must differ so"
                " that the test split scores runs the selection never saw"
            )
        for alpha in self.constrained_alphas:
            if not 0.0 <= alpha < 1.0:
                raise ValueError(f"every alpha must be in [0, 1), got {alpha}")
        for cost in self.constrained_costs:
            if cost is not None and not cost > 0:
                raise ValueError(f"every resilient cost must be > 0 or None (hard), got {cost}")
        sizes = {name: len(grid_points(axes)) for name, axes in self.grids().items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"both grids must have the same number of points, got {sizes}")
        if self.selection_multiple not in self.noise_multiples:
            raise ValueError(
                f"selection_multiple {self.selection_multiple} must be one of the noise "
                f"multiples {self.noise_multiples}"
            )
        if not self.seeds or self.workers < 1 or self.threads < 1:
            raise ValueError("seeds must be non-empty and workers, threads at least 1")

    def grids(self) -> dict[str, dict[str, tuple[Any, ...]]]:
        """Each method's grid axes (the same for both parts)."""
        return {
            "erm": {"lr_scale": self.erm_lr_scales(), "weight_decay": self.erm_weight_decays},
            "constrained": {
                "resilient_cost": self.constrained_costs,
                "alpha": self.constrained_alphas,
            },
        }

    def erm_lr_scales(self) -> tuple[float, ...]:
        """ERM's learning rates relative to the constrained runs' (``erm_lrs / text_lr``)."""
        return tuple(lr / self.text_lr for lr in self.erm_lrs)

    def options(self, method: str, point: dict[str, Any], part: str) -> dict[str, Any]:
        """The training options of ``method`` at ``point`` in ``part`` (``text`` or ``video``).

        Returns:
            ``{"lr", "weight_decay", "alpha", "resilient_cost"}``; ERM ignores the last two.
        """
        base = self.text_lr if part == "text" else self.video_lr
        if method == "erm":
            return {
                "lr": base * point["lr_scale"],
                "weight_decay": point["weight_decay"],
                "alpha": 0.0,
                "resilient_cost": None,
            }
        return {
            "lr": base * point.get("lr_scale", 1.0),
            "weight_decay": point.get("weight_decay", self.weight_decay),
            "alpha": point["alpha"],
            "resilient_cost": point["resilient_cost"],
        }

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        """smoke: seconds, for CI; quick: < 5 min on 2 cores (previews); full: the test."""
        return cls(mode=mode, **PRESETS[check_mode(mode)])


Unit = Mapping[str, Any]


def robust_score(units: Sequence[Unit], tolerance: float) -> Callable[[Unit], float]:
    """The text selection score: validation accuracy under the selection noise, NaN (never
    selected) for a unit whose clean validation accuracy is more than ``tolerance`` below the
    best clean one among ``units`` (one method's grid)."""
    clean = [u["validation_clean"] for u in units if math.isfinite(u["validation_clean"])]
    floor = max(clean) - tolerance if clean else math.nan

    def score(unit: Unit) -> float:
        return unit["validation_robust"] if unit["validation_clean"] >= floor else math.nan

    return score


def constraints_act(unit: Unit) -> bool:
    """Whether a run's constraints acted by the claims' checks: the largest lambda during
    training at least ``acting.MULTIPLIER_FLOOR`` and some lambda positive in at least
    ``acting.ACTIVE_SHARE_FLOOR`` of the steps (never for ERM or a diverged run)."""
    peak, share = unit.get("multiplier_max"), unit.get("multiplier_active_share")
    if peak is None or share is None:
        return False
    return float(peak) >= acting.MULTIPLIER_FLOOR and float(share) >= acting.ACTIVE_SHARE_FLOOR


def denoising_score(units: Sequence[Unit], tolerance: float) -> Callable[[Unit], float]:
    """The video selection score (lower is better): validation RMSE at the selection noise.

    NaN (never selected) for a unit outside the pool or above the ceiling. The pool is the
    units whose constraints act (:func:`constraints_act`), or every unit when none does; the
    ceiling is (1 + ``tolerance``) x the pool's best RMSE at the training noise (one method's
    grid)."""
    acted = [unit for unit in units if constraints_act(unit)]
    pool = acted or list(units)
    at_training = [u["validation_rmse_train_noise"] for u in pool]
    finite = [value for value in at_training if math.isfinite(value)]
    ceiling = (1 + tolerance) * min(finite) if finite else math.nan

    def score(unit: Unit) -> float:
        if acted and not constraints_act(unit):
            return math.nan
        if unit["validation_rmse_train_noise"] <= ceiling:
            return float(unit["validation_rmse_selection"])
        return math.nan

    return score


def selected_index(units: Sequence[Unit], score: Callable[[Unit], float]) -> int | None:
    """The index of the lowest finite ``score`` among ``units`` (ties: the first); None when no
    unit scores."""
    scored = [(score(unit), index) for index, unit in enumerate(units)]
    finite = [(value, index) for value, index in scored if math.isfinite(value)]
    return min(finite)[1] if finite else None


def revised_selection(video: Mapping[str, Any], tolerance: float) -> str:
    """What design 3's denoiser selection picks on a stored constrained grid, beside the point
    the stored final runs trained (a sentence; empty without a stored grid)."""
    grid = video.get("selection", {}).get("constrained")
    if not grid:
        return ""
    index = selected_index(grid, denoising_score(grid, tolerance))
    if index is None:
        return " On this data's grid design 3's denoiser selection finds no selectable point."
    point = grid[index]
    shown = _point(point)
    stored = _point(video["selected"]["constrained"])
    acts = (
        f"its constraints act on the selection run: largest lambda {point['multiplier_max']:.2g}, "
        f"active in {100 * point['multiplier_active_share']:.0f} % of the steps"
        if constraints_act(point)
        else "no grid point's constraints act on the selection run"
    )
    same = shown == stored
    return f" On this data's grid design 3's denoiser selection picks {shown} ({acts}); " + (
        "design 2 picked the same point."
        if same
        else f"the final runs here are of design 2's pick ({stored}), so this data cannot "
        "test the revised selection."
    )


def _point(point: Mapping[str, Any]) -> str:
    cost = point["resilient_cost"]
    return f"c {'hard' if cost is None else f'{cost:g}'}, alpha {point['alpha']:g}"


# How the denoiser's depth was chosen (a note of the full report).
REGIME_PILOT = (
    "The denoiser's depth: an ERM-only pilot of design 2 (docs/results/descent-full/"
    "erm_bump_pilot.json; 3 seeds, 800 steps) found 8-layer ERM denoisers rising 29-118 % from "
    "layer 1 to layer 2, but it scored the crops of the frames the test split uses, against the "
    "protocol (pilots read validation only). Design 3's pilot (descent/pilot.py: ERM's grid on "
    "validation frames, seeds 30-32) supersedes it by a rule declared before it runs: the 8 "
    "layers stay if the pilot picks them, else the study uses the pilot's pick."
)


# The values that differ per mode; every other field keeps its default (quick: about 5
# minutes on 2 cores, previews only). smoke: seconds, for CI (MiniLM cut to 2 layers, a
# 2-layer denoiser, one point per grid).
#
# full, design 3, declared before its run. The constrained grid: c in {10, 1000, hard} (u =
# lambda / c, so c = 10 leaves slacks of lambda / 10 and 1000 almost none) x alpha in {0.05,
# 0.2}. ERM: lr 0.5x, 1x, 2x the constrained runs' base x weight decay {0.01, 0.1}. Grid runs
# train as long as the final runs (design 2's grids ran 60 of 150 text steps and 500 of 1000
# denoiser steps, so a point was selected at a budget the final runs did not share). Seeds no
# earlier design read: selection seed 20 (design 2 selected on seed 0), final seeds 21-25
# (design 1 ran 0-2, design 2 ran 1-5); the regime pilot runs seeds 30-32 (:mod:`.pilot`).
# The denoiser has 8 layers in every mode but smoke; design 3 keeps them if the validation
# pilot picks them and otherwise uses its pick (:data:`REGIME_PILOT`). Measured cost on 2
# cores: a MiniLM step (batch 32) 3.1 CPU-s, one test condition (1,056 sentences) about 21
# CPU-s, a denoiser step 0.14 CPU-s (0.07 as implied by design 2's full-run wall time). Text
# grid 12 x ~550 CPU-s, text finals 10 x ~860, denoiser 22 runs x 1000 steps: about 4.7-5.1
# CPU-hours (2.3-2.5 hours on 2 cores), against 3.6-3.9 for design 2 (shorter grid runs).
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "constrained_costs": (10.0,),
        "erm_weight_decays": (0.01,),
        "text_layers": 2,
        "train_examples": 256,
        "validation_examples": 64,
        "test_examples": 64,
        "text_steps": 6,
        "text_grid_steps": 6,
        "text_batch_size": 16,
        "additive_gammas": (1.0,),
        "discrete_gammas": (0.2,),
        "typo_rates": (0.1,),
        "dropout_rates": (0.2,),
        "video_frames": 12,
        "train_crops": 256,
        "validation_crops": 64,
        "test_crops": 64,
        "denoiser_layers": 2,
        "denoiser_width": 32,
        "video_steps": 10,
        "video_grid_steps": 10,
        "video_batch_size": 32,
        "noise_multiples": (1.0, 2.0),
        "workers": 1,
    },
    "quick": {},
    "full": {
        "selection_seed": 20,
        "seeds": (21, 22, 23, 24, 25),
        "constrained_costs": (10.0, 1000.0, None),
        "constrained_alphas": (0.05, 0.2),
        "erm_lrs": (5e-5, 1e-4, 2e-4),
        "erm_weight_decays": (0.01, 0.1),
        "train_examples": None,
        "validation_examples": None,
        "test_examples": None,
        "text_steps": 150,
        "text_grid_steps": 150,
        "text_batch_size": 32,
        "additive_gammas": (0.5, 1.0, 2.0),
        "discrete_gammas": (0.1, 0.2, 0.4),
        "typo_rates": (0.05, 0.1, 0.2),
        "dropout_rates": (0.1, 0.2, 0.3),
        "video_frames": 400,
        "train_crops": 16384,
        "validation_crops": 2048,
        "test_crops": 2048,
        "video_steps": 1000,
        "video_grid_steps": 1000,
        "noise_multiples": (0.5, 1.0, 1.5, 2.0, 2.5, 3.0),
    },
}
