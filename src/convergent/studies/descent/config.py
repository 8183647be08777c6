"""The ``descent`` study's settings: the parts, the declared grids, the selection rule, seeds.

Both methods of a part get a grid of the same size, trained with the selection seed and
scored on the validation split only. ERM goes first, over learning rate x weight decay (ERM
has no constraint; its two axes are the knobs it has); the constrained model then runs over
resilient cost c (``None``: hard constraints) x the required decrease alpha at the learning
rate and weight decay ERM selected, so the two differ by the constraints alone. The selection
rule is the same for both (:func:`~.selection.robust_score` on text,
:func:`~.selection.denoising_score` on the denoiser): the best validation score under the
selection shift among the method's points whose clean validation score is within a tolerance
of its own best clean one, so a point cannot win robustness by giving up clean quality; what
the constraints cost in clean quality is the clean-accuracy claim's to judge, on test.

On the denoiser (design 3) the floor is (1 + tolerance) x the best validation RMSE at the
training noise among the method's points *where its constraints act* on the selection run
(the claims' own checks: largest lambda at least 0.1, some lambda positive in at least 20 % of
the steps), and only those points are selectable; a grid with no such point (ERM's, which has
no constraints, or a constrained grid whose constraints never act) is scored over all its
points. Design 2 took the floor over every constrained point: binding cost more than 1 % RMSE
at the training noise, so the floor removed every point where the constraints acted and the
claims' checks could not pass.

Part (c), the language model (:class:`LanguageConfig`), joined design 3 before any of its
numbers. There each method selects its own learning rate (ERM over lr x weight decay, the
constrained model over lr x alpha x c, grids of the same size), both by the denoiser's rule on
perplexity (:func:`~.selection.language_score`): the best validation perplexity under
Gaussian embedding noise among the points where the constraints act, within a tolerance of the
best such clean validation perplexity.

The modes differ only in the values of :data:`PRESETS`; every other field keeps its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from convergent.studies.framework import check_mode, grid_points

METHODS = ("erm", "constrained")
# Part (c)'s claims are read at this Gaussian embedding-noise level (the paper's gamma).
LANGUAGE_CLAIM_GAMMA = 1.5


def _check_grids(
    alphas: tuple[float, ...],
    costs: tuple[float | None, ...],
    grids: Mapping[str, Mapping[str, tuple[Any, ...]]],
    part: str,
    cost_name: str,
) -> None:
    """Every alpha in [0, 1), every cost positive (or None: hard), grids of equal size."""
    for alpha in alphas:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"every {part}alpha must be in [0, 1), got {alpha}")
    for cost in costs:
        if cost is not None and not cost > 0:
            raise ValueError(f"every {cost_name} must be > 0 or None (hard), got {cost}")
    sizes = {name: len(grid_points(axes)) for name, axes in grids.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"both {part}grids must have the same number of points, got {sizes}")


@dataclass(frozen=True)
class LanguageConfig:
    """Part (c): a GPT-style causal LM pretrained on Jane Austen, then fine-tuned by ERM and by
    descent constraints on held-apart text (the defaults are the quick mode's).

    Both methods select their own learning rate on validation over grids of the same size: ERM
    over learning rate x weight decay, the constrained model over learning rate x alpha x
    resilient cost (at ``weight_decay``). Grid and final runs train for the same ``steps``.

    Attributes:
        layers, width, heads: the decoder's depth L, d_model and attention heads.
        max_length: WordPiece tokens kept of each 256-character window.
        pretrain_windows, finetune_windows, validation_windows, test_windows: evenly spaced
            windows kept of each portion (None: all of it).
        pretrain_seed: the seed of the one pretraining run every fine-tune starts from.
        pretrain_steps: the pretraining's step cap.
        evaluate_every: steps between the pretraining's validation evaluations.
        pretrain_lr: AdamW's pretraining lr (constant after ``evaluate_every`` warm-up steps).
        steps, batch_size: every fine-tune's AdamW steps and windows per step (also the
            pretraining's batch size).
        erm_lrs, erm_weight_decays: ERM's grid.
        lrs, alphas, costs: the constrained grid (costs: resilient c, None for hard).
        weight_decay: the constrained runs' AdamW decay.
        gammas: the test levels of Gaussian embedding noise (x embedding RMS).
        selection_gamma: the noise level of the validation selection score.
        token_fraction: the share of target tokens the inner layers are read out at in a
            primal-dual step (an unbiased estimate; the last layer stays exact).
    """

    layers: int = 4
    width: int = 128
    heads: int = 4
    max_length: int = 64
    pretrain_windows: int | None = 2048
    finetune_windows: int | None = 1024
    validation_windows: int | None = 128
    test_windows: int | None = 256
    pretrain_seed: int = 40
    pretrain_steps: int = 80
    evaluate_every: int = 40
    pretrain_lr: float = 1e-3
    steps: int = 30
    batch_size: int = 16
    erm_lrs: tuple[float, ...] = (1e-3,)
    erm_weight_decays: tuple[float, ...] = (0.01, 0.1)
    lrs: tuple[float, ...] = (1e-3,)
    alphas: tuple[float, ...] = (0.2,)
    costs: tuple[float | None, ...] = (10.0, None)
    weight_decay: float = 0.01
    gammas: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0)
    selection_gamma: float = LANGUAGE_CLAIM_GAMMA
    token_fraction: float | None = 0.25

    def __post_init__(self) -> None:
        _check_grids(self.alphas, self.costs, self.grids(), "language ", "language cost")
        if LANGUAGE_CLAIM_GAMMA not in self.gammas:
            raise ValueError(
                f"the language gammas {self.gammas} must include {LANGUAGE_CLAIM_GAMMA}, the "
                "level part (c)'s noise claim is read at"
            )
        if self.evaluate_every < 1 or self.pretrain_steps < 1 or self.steps < 1:
            raise ValueError("evaluate_every, pretrain_steps and steps must be at least 1")

    def grids(self) -> dict[str, dict[str, tuple[Any, ...]]]:
        """Each method's grid axes: ERM's lr x weight decay, the constrained lr x alpha x c."""
        return {
            "erm": {"lr": self.erm_lrs, "weight_decay": self.erm_weight_decays},
            "constrained": {"lr": self.lrs, "alpha": self.alphas, "resilient_cost": self.costs},
        }

    def options(self, method: str, point: Mapping[str, Any]) -> dict[str, Any]:
        """The training options of ``method`` at ``point``: ``{"lr", "weight_decay", "alpha",
        "resilient_cost"}`` (ERM: alpha 0, no cost)."""
        if method == "erm":
            return {
                "lr": point["lr"],
                "weight_decay": point["weight_decay"],
                "alpha": 0.0,
                "resilient_cost": None,
            }
        return {
            "lr": point["lr"],
            "weight_decay": self.weight_decay,
            "alpha": point["alpha"],
            "resilient_cost": point["resilient_cost"],
        }


@dataclass(frozen=True)
class Config:
    """Every setting of the study; ``for_mode`` gives the three standard sizes (the
    defaults are the quick mode's: about 8 minutes on 2 cores, part (c) 3 of them; previews).

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
            at most (1 + this) x its method's best one; language: likewise its clean
            validation perplexity.
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
        run_language: whether part (c), the language model, runs.
        language: part (c)'s settings (:class:`LanguageConfig`).
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
    run_language: bool = True
    language: LanguageConfig = LanguageConfig()
    workers: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.selection_seed in self.seeds:
            raise ValueError(
                f"selection_seed {self.selection_seed} is also a final seed; they must differ so"
                " that the test split scores runs the selection never saw"
            )
        _check_grids(
            self.constrained_alphas, self.constrained_costs, self.grids(), "", "resilient cost"
        )
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

    def text_levels(self) -> dict[str, tuple[float, ...]]:
        """Each test shift of part (a) (embedding perturbations, then text shifts) and its
        levels."""
        return {
            "gaussian": self.additive_gammas,
            "uniform": self.additive_gammas,
            "discrete": self.discrete_gammas,
            "typos": self.typo_rates,
            "word_dropout": self.dropout_rates,
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


# The values that differ per mode; every other field keeps its default (quick: about 5
# minutes on 2 cores for parts (a) and (b) and 3 for part (c), previews only). smoke: seconds,
# for CI (MiniLM cut to 2 layers, a 2-layer denoiser, a 2-layer language model, one point per
# grid).
#
# full, design 3, declared before its run. The constrained grid: c in {10, 1000, hard} (u =
# lambda / c, so c = 10 leaves slacks of lambda / 10 and 1000 almost none) x alpha in {0.05,
# 0.2}. ERM: lr 0.5x, 1x, 2x the constrained runs' base x weight decay {0.01, 0.1}. Grid runs
# train as long as the final runs (design 2's grids ran 60 of 150 text steps and 500 of 1000
# denoiser steps, so a point was selected at a budget the final runs did not share). Seeds no
# earlier design read: selection seed 20 (design 2 selected on seed 0), final seeds 21-25
# (design 1 ran 0-2, design 2 ran 1-5); the regime pilot runs seeds 30-32 (:mod:`.pilot`).
# The denoiser has 8 layers in every mode but smoke; design 3 keeps them if the validation
# pilot picks them and otherwise uses its pick (:data:`.report.REGIME_PILOT`). Measured cost on 2
# cores: a MiniLM step (batch 32) 3.1 CPU-s, one test condition (1,056 sentences) about 21
# CPU-s, a denoiser step 0.14 CPU-s (0.07 as implied by design 2's full-run wall time). Text
# grid 12 x ~550 CPU-s, text finals 10 x ~860, denoiser 22 runs x 1000 steps: about 4.7-5.1
# CPU-hours (2.3-2.5 hours on 2 cores), against 3.6-3.9 for design 2 (shorter grid runs).
#
# Part (c), the language model (design 3, declared before any of its numbers): a 4-layer
# pre-norm causal decoder (d_model 128, 4 heads, tied LM head, GPT-2's shape at a CPU's size)
# on MiniLM's WordPiece tokens of 256-character windows of the austen source (the first 64
# tokens of each; the vocabulary is the 11,067 WordPiece tokens of the training windows). Each
# novel's training block is cut by position: its first two thirds pretrain one shared
# checkpoint (seed 40), until validation perplexity gains < 2 % over the last two evaluations
# (every 250 steps) or at 3,000 steps; its last third (the text just before validation and
# test) is held apart for fine-tuning. Fine-tuning: 300 AdamW steps of 32 windows (10 %
# warm-up, linear decay, clip 1.0, the same data order per seed for both methods). Grids of 8:
# ERM lr {3e-4, 1e-3} x weight decay {0, 0.01, 0.1, 0.3}; constrained lr {3e-4, 1e-3} x alpha
# {0.05, 0.2} x c {10, hard} (weight decay 0.01), dual lr 0.5, inner layers read out at a
# quarter of the target tokens. Selection as the denoiser's (:func:`language_score`, noise at
# gamma 1.5 on the 783 validation windows); seeds as parts (a) and (b); the pilot
# (:func:`~convergent.studies.descent.pilot.run_language_pilot`) uses 30-32.
# Measured cost (under nice -n 19 while a background job held both cores, so high; CPU time
# of one process, 1 thread; wall read 1.5x): a pretraining or ERM step 0.77 CPU-s, a
# primal-dual step 1.13 (1.98 reading every token out), per-sequence losses on 783 windows
# 12.9 CPU-s per noise level, per-layer losses 37.7. Budget: pretraining <= 3,000 x 0.77 + 13
# evaluations = 2,380 CPU-s; 8 ERM grid runs x (300 x 0.77 + 76 of validation scoring) =
# 2,456; 8 constrained x (300 x 1.13 + 76) = 3,320; 5 ERM finals x (231 + 128 of test
# scoring) = 1,795; 5 constrained x (339 + 128) = 2,335: 12,286 CPU-s, 3.4 CPU-hours (1.7 hours
# on 2 cores), at most 4 even if every measured cost were 15 % low. Quick (the defaults): 80
# pretraining and 30 fine-tuning steps of 16 windows, one seed, 2-point grids, 128 validation
# and 256 test windows: measured at 200 CPU-s (26 in the main process, which pretrains; 174 in
# the 2 workers that fine-tune), so about 2 minutes on 2 idle cores.
# The margins (5 points each) against the design's smallest detectable effect, the expected
# half-width of the win rate's interval over 783 test windows and 5 seeds: 1.6 points if every
# sequence's outcome were independent (1.96 x sqrt(0.25 / 3,915)), 3.5 if each sequence's
# outcome repeated in every seed (1.96 x sqrt(0.25 / 783)); a seed-to-seed SD s of the win
# rate adds about 2.78 s / sqrt(5) (pilot.expected_half_width: 2.78 x sqrt(s^2 / 5 + 0.25 /
# 3,915)), so a 5-point margin is resolvable while s is below about 3.5 points (s = 3: 4.3
# points; s = 4: 5.4). The pilot measures s and the half-width on validation, ERM against ERM.
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
        "language": LanguageConfig(
            layers=2,
            width=32,
            heads=2,
            max_length=32,
            pretrain_windows=256,
            finetune_windows=128,
            validation_windows=32,
            test_windows=32,
            pretrain_steps=6,
            evaluate_every=3,
            steps=4,
            batch_size=8,
            erm_weight_decays=(0.01,),
            costs=(10.0,),
            gammas=(1.5,),
        ),
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
        "language": LanguageConfig(
            pretrain_windows=None,
            finetune_windows=None,
            validation_windows=None,
            test_windows=None,
            pretrain_steps=3000,
            evaluate_every=250,
            steps=300,
            batch_size=32,
            erm_lrs=(3e-4, 1e-3),
            erm_weight_decays=(0.0, 0.01, 0.1, 0.3),
            lrs=(3e-4, 1e-3),
            alphas=(0.05, 0.2),
            costs=(10.0, None),
        ),
    },
}
