"""The ``sparsity`` study's settings, and the training recipes and grids they imply."""

from __future__ import annotations

from dataclasses import dataclass

from .common import check_mode
from .sparsity_runs import OPTIMIZERS, OptimizerSettings, Recipe

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
            return cls(
                mode=mode,
                learning_rates=(3e-3,),
                sparsities=(0.8,),
                lm_sparsities=(0.5, 0.9),
                vit_d_model=32,
                vit_d_ff=64,
                vit_steps=20,
                vit_batch_size=64,
                train_examples=2000,
                validation_examples=200,
                test_examples=500,
                lm_seq_len=32,
                lm_d_model=32,
                lm_d_ff=64,
                lm_steps=20,
                lm_batch_size=16,
                lm_validation_windows=32,
            )
        if mode == "quick":
            return cls(mode=mode)
        # About 1.5 hours on 2 cores: 66 classifier runs and 21 language-model runs.
        return cls(
            mode=mode,
            seeds=(0, 1, 2, 3, 4),
            learning_rates=(1e-3, 2e-3, 4e-3),
            image_size=28,
            vit_steps=1500,
            validation_examples=5000,
            test_examples=None,
            lm_d_model=128,
            lm_d_ff=256,
            lm_steps=1500,
            lm_validation_windows=1024,
        )


def optimizer_settings(config: Config) -> OptimizerSettings:
    return OptimizerSettings(
        config.weight_decay,
        config.horst_alpha,
        config.horst_beta,
        config.ham_alpha,
        config.ham_beta,
    )


def tuning_grids(config: Config) -> dict[str, dict[str, list[float]]]:
    return {name: {"lr": list(config.learning_rates)} for name in config.optimizers}


def vision_recipe(config: Config) -> Recipe:
    shape = {
        "d_model": config.vit_d_model,
        "n_layers": config.vit_layers,
        "n_heads": config.vit_heads,
        "d_ff": config.vit_d_ff,
    }
    return Recipe(optimizer_settings(config), shape, config.vit_steps, config.vit_batch_size)


def language_recipe(config: Config) -> Recipe:
    shape = {
        "d_model": config.lm_d_model,
        "n_layers": config.lm_layers,
        "n_heads": config.lm_heads,
        "d_ff": config.lm_d_ff,
    }
    return Recipe(optimizer_settings(config), shape, config.lm_steps, config.lm_batch_size)
