"""Part (c) of the ``sparsity`` study: does a HORST fine-tune make a pretrained model prune
better? Its settings, declared before its first run.

Set-up. Pretrained MiniLM-L6 (with a fresh mean-pooled 2-class head) is fine-tuned for
sentiment on rt-sentences, with HORST or with AdamW; a copy of each fine-tuned model is then
pruned one-shot by every :data:`VARIANTS` entry of the mode (magnitude, Wanda and SparseGPT to
50 %, 70 % and 2:4; OWL over Wanda and SparseGPT at 70 %). Wanda, SparseGPT and OWL calibrate
on a fixed draw of training sentences. Part (c) uses the library's mask rules (the authors'),
where parts (a) and (b) stay pinned to theirs. The encoder's 36 linear layers are pruned; the
embeddings and the head stay dense (``MaskSpec()``'s defaults).

Grids. Equal sizes: HORST strength (the first step's mirror/Adam move ratio,
``HORST(strength=...)``) x learning rate; AdamW learning rate x weight decay. Selection on
the selection seed by validation accuracy after SparseGPT to 70 %; a HORST point is selectable
only where its move ratio over the fine-tune is at least :data:`SELECTABLE_MOVE_RATIO` (0.3, a
margin above the check's 0.2; STUDIES.md rule 13). Final runs on fresh seeds, scored once on
the test sentences.

The modes are data: :data:`FINETUNE_PRESETS` holds the fields each mode sets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from convergent.studies.framework import check_mode, grid_points

OPTIMIZERS = ("adamw", "horst")
SELECTION_VARIANT = "sparsegpt 70%"  # the validation criterion's pruner and target
SELECTABLE_MOVE_RATIO = 0.3  # a HORST point below this is never selected (the check: 0.2)
READOUT = "readout"  # the readout-only fine-tune behind the "moved" check
CRITERION = (
    "validation accuracy after one-shot SparseGPT to 70 %, among the points whose move ratio is "
    f"at least {SELECTABLE_MOVE_RATIO:g} (HORST; n/a: below)"
)


@dataclass(frozen=True)
class Variant:
    """One pruned copy: ``pruner`` (magnitude, wanda, sparsegpt) to ``target`` (``"70%"`` or an
    N:M pattern ``"2:4"``), with OWL's allocation or the uniform one."""

    pruner: str
    target: str
    owl: bool = False

    @property
    def label(self) -> str:
        """The data key: ``"sparsegpt 70%"``, ``"wanda owl 70%"``, ``"magnitude 2:4"``."""
        return f"{self.pruner}{' owl' if self.owl else ''} {self.target}"

    @property
    def pattern(self) -> str:
        return self.target if ":" in self.target else "unstructured"

    @property
    def sparsity(self) -> float:
        """The fraction pruned (N:M: 1 - N/M)."""
        if ":" in self.target:
            n, m = (int(part) for part in self.target.split(":"))
            return 1 - n / m
        return float(self.target.rstrip("%")) / 100


def variants(labels: tuple[str, ...]) -> tuple[Variant, ...]:
    """The variants named by their labels (``"wanda owl 70%"``), one error sentence for an
    unknown pruner or a malformed label."""
    found = []
    for label in labels:
        parts = label.split()
        owl = len(parts) == 3 and parts[1] == "owl"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not owl):
            raise ValueError(f"a variant is 'PRUNER TARGET' or 'PRUNER owl TARGET', got {label!r}")
        if parts[0] not in ("magnitude", "wanda", "sparsegpt"):
            raise ValueError(
                f"a variant's pruner must be magnitude, wanda or sparsegpt, got {parts[0]!r}"
            )
        found.append(Variant(parts[0], parts[-1], owl))
    return tuple(found)


ALL_VARIANTS = (
    "magnitude 50%",
    "wanda 50%",
    "sparsegpt 50%",
    "magnitude 70%",
    "wanda 70%",
    "sparsegpt 70%",
    "magnitude 2:4",
    "wanda 2:4",
    "sparsegpt 2:4",
    "wanda owl 70%",
    "sparsegpt owl 70%",
)


@dataclass(frozen=True)
class FinetuneConfig:
    """Part (c)'s settings.

    Attributes:
        selection_seed: the seed of every grid point (validation only).
        seeds: the final runs' seeds (test), new to this part.
        horst_strengths, horst_lrs: HORST's grid (strength x lr).
        adamw_lrs, adamw_weight_decays: AdamW's grid (lr x weight decay), as many points.
        horst_weight_decay, horst_beta: HORST's fixed decoupled weight decay (matrices) and L1
            shrinkage.
        steps, batch_size, max_length: the fine-tune (5 % warm-up, cosine, clip 1.0).
        layers: MiniLM's first layers kept (None: all 6; the smoke mode cuts it).
        validation_sentences, test_sentences: evaluation subsets (None: all 1,056).
        calibration_sentences: training sentences Wanda, SparseGPT and OWL calibrate on.
        readout_lr: the readout-only fine-tune's lr (AdamW on the head alone, the same steps).
        variants: the pruned copies scored in the final runs (labels of :class:`Variant`); the
            selection reads :data:`SELECTION_VARIANT` alone.
        extension_rounds: equal grid extensions while a selection lies on an edge.
        workers: processes running units side by side (each ``threads`` threads).
        threads: torch threads per process.
    """

    mode: str = "quick"
    selection_seed: int = 0
    seeds: tuple[int, ...] = (1,)
    horst_strengths: tuple[float, ...] = (1.0,)
    horst_lrs: tuple[float, ...] = (1e-4,)
    adamw_lrs: tuple[float, ...] = (1e-4,)
    adamw_weight_decays: tuple[float, ...] = (0.01,)
    horst_weight_decay: float = 0.01
    horst_beta: float = 0.0
    steps: int = 20
    batch_size: int = 16
    max_length: int = 64
    layers: int | None = None
    validation_sentences: int | None = 128
    test_sentences: int | None = 128
    calibration_sentences: int = 32
    readout_lr: float = 1e-3
    variants: tuple[str, ...] = ("magnitude 70%", "wanda 70%", "sparsegpt 70%")
    extension_rounds: int = 0
    workers: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        check_mode(self.mode)
        found = variants(self.variants)
        if SELECTION_VARIANT not in self.variants:
            raise ValueError(
                f"variants must include {SELECTION_VARIANT!r}, which the selection reads, got "
                f"{list(self.variants)}"
            )
        for variant in found:
            if variant.owl and variant.pattern != "unstructured":
                raise ValueError(f"OWL allocates unstructured sparsity, got {variant.label!r}")
            if not 0.0 < variant.sparsity < 1.0:
                raise ValueError(f"a variant's sparsity must be in (0, 1), got {variant.label!r}")
        sizes = {name: len(grid_points(axes)) for name, axes in self.grids().items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"every fine-tune grid must have the same number of points: {sizes}")
        if self.selection_seed in self.seeds:
            raise ValueError(
                f"selection_seed {self.selection_seed} is also a final seed; they must differ"
            )
        if self.steps < 1 or self.batch_size < 1 or self.calibration_sentences < 1:
            raise ValueError(
                "steps, batch_size and calibration_sentences must be at least 1, got "
                f"{self.steps}, {self.batch_size}, {self.calibration_sentences}"
            )
        if not self.seeds or self.workers < 1 or self.threads < 1:
            raise ValueError("seeds must be non-empty and workers, threads at least 1")

    def grids(self) -> dict[str, dict[str, tuple[float, ...]]]:
        """Each optimizer's grid axes."""
        return {
            "adamw": {"lr": self.adamw_lrs, "weight_decay": self.adamw_weight_decays},
            "horst": {"lr": self.horst_lrs, "strength": self.horst_strengths},
        }

    def options(self, name: str, point: dict[str, float]) -> dict[str, float]:
        """Every optimizer option of ``name`` at ``point``: the grid's and the fixed ones."""
        if name == READOUT:
            return {"lr": self.readout_lr, "weight_decay": 0.0}
        fixed = (
            {"weight_decay": self.horst_weight_decay, "beta": self.horst_beta}
            if name == "horst"
            else {}
        )
        return {**fixed, **point}

    @classmethod
    def for_mode(cls, mode: str) -> FinetuneConfig:
        check_mode(mode)
        return cls(mode=mode, **FINETUNE_PRESETS[mode])


def finetune_settings(study: Any) -> FinetuneConfig:
    """Part (c)'s settings at the sparsity study's mode, with its seeds, selection seed,
    workers and threads (so ``--seeds`` reaches part (c) too; in full mode: selection seed 20,
    final seeds 21-25, new to this part)."""
    return dataclasses.replace(
        FinetuneConfig.for_mode(study.mode),
        seeds=tuple(study.seeds),
        selection_seed=study.selection_seed,
        workers=study.workers,
        threads=study.threads,
    )


# Declared before part (c)'s first run (docs/studies.md, "sparsity part (c)"). Full: the
# issue's regime pilot (one seed, AdamW at lr 5e-5, 150 steps of 32 sentences) left AdamW room
# at every target (2.4 to 30 points lost); HORST's strengths span the check's floor (0.2) to
# far above it, AdamW's learning rates the usual fine-tuning range around the pilot's 5e-5;
# 8 points each. Quick: one point each, fewer steps, sentences and variants (a preview).
FINETUNE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "steps": 3,
        "batch_size": 8,
        "layers": 2,
        "validation_sentences": 48,
        "test_sentences": 48,
        "calibration_sentences": 8,
        "variants": ("magnitude 70%", "sparsegpt 70%", "wanda owl 70%"),
        "workers": 1,
    },
    "quick": {},
    "full": {
        "horst_strengths": (0.5, 1.0, 2.0, 4.0),
        "horst_lrs": (5e-5, 1e-4),
        "adamw_lrs": (2.5e-5, 5e-5, 1e-4, 2e-4),
        "adamw_weight_decays": (0.01, 0.1),
        "steps": 150,
        "batch_size": 32,
        "validation_sentences": None,
        "test_sentences": None,
        "calibration_sentences": 128,
        "variants": ALL_VARIANTS,
        "extension_rounds": 1,
    },
}

# Part (c)'s grid search, as `results.json`'s ``tuning`` names it.
FINETUNE_TUNING = "(c) MiniLM fine-tune, SparseGPT 70 % on validation, selection seed"
