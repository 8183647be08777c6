"""The ``langevin`` study's settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from convergent.studies.common import check_mode

VARIANTS = ("none", "log", "power")


@dataclass(frozen=True)
class Config:
    """Every choice of the study (sizes per mode in `for_mode`).

    Attributes:
        mode: "smoke", "quick" or "full".
        seeds: one run per seed (model init, data order, noise).
        train_examples: use the first this many training examples (None: all 900).
        d_model: width of the Transformer (one head, so the head width too).
        pretrain_steps, pretrain_lr, pretrain_batch_size: phase 1 (AdamW, every parameter).
        langevin_steps, langevin_lr, langevin_batch_size: phase 2 (W_Q, W_K or LoRA factors).
        s: the Langevin diffusion coefficient (temperature s / 2); None means 2 / N_train, the
            posterior at temperature 1 for the loss summed over the training set.
        lam_rule: "radius" (default) or "loss_fraction", how lam is set (module docstring).
        radius_factor: for "radius": the penalty's stationary ||W||_F over the start norm.
        penalty_fraction: for "loss_fraction": the penalty at the start of phase 2 over the
            training loss.
        power_eps: the exponent excess of the super-quadratic penalty (||W||^(2 + eps)).
        record_every: evaluation interval in phase 2, in steps.
        lora_layers, lora_rank: the LoRA variant's depth and rank.
        villani_radii: multiples of the final ||(W_Q, W_K)|| along which the Villani
            quantity is estimated; villani_probes Hutchinson probes on villani_examples.
        growth_threshold: a norm "grows" if its linear trend over the second half of phase 2
            adds more than this fraction of its mean, and is "bounded" otherwise.
        gap_threshold: the gap "creeps up" if it rises by more than this fraction of the
            starting test RMSE over phase 2.
        accuracy_tolerance: "about the same accuracy" means final test RMSEs within this
            relative difference.
        workers: processes that run (seed, experiment) jobs in parallel (results do not depend
            on it). They are spawned, so a script that calls `run` with workers > 1 needs the
            usual `if __name__ == "__main__":` guard (the `convergent` command has it).
        threads: torch CPU threads during the run (restored afterwards); the model is so small
            that more threads mostly add synchronization (10x slower on a busy 2-core machine).
    """

    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    train_examples: int | None = None
    d_model: int = 16
    pretrain_steps: int = 1500
    pretrain_lr: float = 3e-3
    pretrain_batch_size: int = 64
    langevin_steps: int = 1500
    langevin_lr: float = 1e-2
    langevin_batch_size: int = 128
    s: float | None = None
    lam_rule: str = "radius"
    radius_factor: float = 2.0
    penalty_fraction: float = 0.01
    power_eps: float = 1.0
    record_every: int = 100
    lora_layers: int = 2
    lora_rank: int = 4
    villani_radii: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    villani_probes: int = 4
    villani_examples: int = 128
    growth_threshold: float = 0.05
    gap_threshold: float = 0.01
    accuracy_tolerance: float = 0.05
    threads: int = 1
    workers: int = 1
    variants: tuple[str, ...] = field(default=VARIANTS)

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        """smoke: seconds, for the test suite; quick: one seed, minutes; full: five seeds."""
        check_mode(mode)
        if mode == "smoke":
            return cls(
                mode=mode,
                train_examples=96,
                d_model=8,
                pretrain_steps=20,
                langevin_steps=20,
                langevin_batch_size=32,
                record_every=10,
                villani_radii=(1.0, 4.0),
                villani_probes=1,
                villani_examples=16,
            )
        if mode == "full":
            return cls(
                mode=mode,
                seeds=(0, 1, 2, 3, 4),
                pretrain_steps=2000,
                langevin_steps=6000,
                record_every=300,
                villani_probes=8,
                workers=min(3, os.cpu_count() or 1),
            )
        # Two processes (W_Q/W_K and LoRA) keep one seed under 5 minutes on 2 cores.
        return cls(
            mode=mode,
            pretrain_steps=1000,
            langevin_steps=2000,
            record_every=100,
            workers=min(2, os.cpu_count() or 1),
        )
