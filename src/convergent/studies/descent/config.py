"""The ``descent`` study's settings: the parts, the declared grids, the selection rule, seeds.

Both methods of a part get a grid of the same size, trained with the selection seed and
scored on the validation split only. ERM goes first, over learning rate x weight decay (ERM
has no constraint; its two axes are the knobs it has); the constrained model then runs over
resilient cost c (``None``: hard constraints) x the required decrease alpha at the learning
rate and weight decay ERM selected, so the two differ by the constraints alone. The selection
rule is the same for both (:func:`convergent.studies.descent.study.robust_score`): the best
validation score under the selection shift among the method's points whose clean validation
score is within a tolerance of its own best clean one, so a point cannot win robustness by
giving up clean quality; what the constraints cost in clean quality is the clean-accuracy
claim's to judge, on test.

The modes differ only in the values of :data:`PRESETS`; every other field keeps its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
        text_steps, text_grid_steps: final and grid runs' AdamW steps.
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
        video_steps, video_grid_steps, video_batch_size, video_lr: part (b) training.
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


# The values that differ per mode; every other field keeps its default (quick: about 5
# minutes on 2 cores, previews only). smoke: seconds, for CI (MiniLM cut to 2 layers, a
# 2-layer denoiser, one point per grid).
#
# full, declared before its run. The constrained grid: c in {10, 1000, hard} (u = lambda / c,
# so c = 10 leaves slacks of lambda / 10 and 1000 almost none) x alpha in {0.05, 0.2}. ERM: lr
# 0.5x, 1x, 2x the constrained runs' base x weight decay {0.01, 0.1}. Grid runs train for
# fewer steps than the final runs, to fit the budget (the report says so). The denoiser has
# 8 layers in every mode but smoke: a pilot of ERM alone (3 seeds, 800 steps, 8192 crops; a
# choice of setting by ERM alone, no method compared;
# docs/results/descent-full/erm_bump_pilot.json) found its per-layer loss rising 29-118 %
# from layer 1 to layer 2 in every seed. Step counts are set by measured cost: on 2 cores a
# MiniLM step (batch 32) costs 3.1 CPU-s and scoring one test condition (1,056 sentences)
# about 21 CPU-s, a denoiser step 0.14 CPU-s; the full mode comes to about 4 CPU-hours (2
# hours on 2 cores).
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
        "seeds": (1, 2, 3, 4, 5),
        "constrained_costs": (10.0, 1000.0, None),
        "constrained_alphas": (0.05, 0.2),
        "erm_lrs": (5e-5, 1e-4, 2e-4),
        "erm_weight_decays": (0.01, 0.1),
        "train_examples": None,
        "validation_examples": None,
        "test_examples": None,
        "text_steps": 150,
        "text_grid_steps": 60,
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
        "video_grid_steps": 500,
        "noise_multiples": (0.5, 1.0, 1.5, 2.0, 2.5, 3.0),
    },
}
