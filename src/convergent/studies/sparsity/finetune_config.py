"""Part (c) of the ``sparsity`` study as a spec: does a HORST fine-tune make a pretrained model
prune better? Its settings, grids, claims, checks and words, declared before its first run.

Set-up. Pretrained MiniLM-L6 (with a fresh mean-pooled 2-class head) is fine-tuned for
sentiment on rt-sentences, with HORST or with AdamW; a copy of each fine-tuned model is then
pruned one-shot by every variant of the mode (magnitude, Wanda and SparseGPT to 50 %, 70 % and
2:4; OWL over Wanda and SparseGPT at 70 %), Wanda, SparseGPT and OWL calibrated on a fixed draw
of training sentences, with the library's mask rules (parts (a) and (b) stay pinned to the
authors'). The encoder's 36 linear layers are pruned; embeddings and head stay dense.

Grids. Equal sizes: HORST strength (the first step's mirror/Adam move ratio) x lr; AdamW lr x
weight decay. Selection on the selection seed by validation accuracy after SparseGPT to 70 %; a
HORST point is selectable only at a move ratio of at least :data:`SELECTABLE_MOVE_RATIO` (0.3,
a margin above the check's 0.2; STUDIES.md rule 13). Final runs on fresh seeds, scored once on
the test sentences.

Claims (:data:`DENSE`, :data:`PRUNED`), each the mean over final seeds and test sentences of
(HORST correct - AdamW correct), paired by seed and sentence, with the two-way interval over
seeds and sentences (:func:`~convergent.studies.framework.crossed_interval`) and its half-width
against the threshold stored as ``extra["resolution"]``:
1. per variant, HORST keeps more test accuracy after pruning: holds if >= 0 (the SparseGPT-70 %
   claim also says "survives a pruner that updates the kept weights"; STUDIES.md rule 14);
2. dense accuracy is the same within 2 points, two-sided.

Checks (:data:`CHECKS`): HORST's move ratio over the final fine-tunes (mean) >= 0.2; room:
AdamW loses >= 2 points from dense at the claim's variant (mean over seeds); moved: each
optimizer's selected point beats MiniLM with its readout trained alone by >= 5 points on
validation (the smaller margin).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.engine import ClaimSpec
from convergent.studies.framework import at_least, check_mode, grid_points, within
from convergent.studies.sparsity.checks import PRUNER_NAMES, CheckWords

SELECTION_VARIANT = "sparsegpt 70%"  # the validation criterion's pruner and target
SELECTABLE_MOVE_RATIO = 0.3  # a HORST point below this is never selected (the check: 0.2)
READOUT = "readout"  # the readout-only fine-tune behind the "moved" check
CRITERION = (
    "validation accuracy after one-shot SparseGPT to 70 %, among the points whose move ratio is "
    f"at least {SELECTABLE_MOVE_RATIO:g} (HORST; n/a: below)"
)
FINETUNE_TUNING = "(c) MiniLM fine-tune, SparseGPT 70 % on validation, selection seed"
FIGURE = "finetune_pruning.png"


@dataclass(frozen=True)
class Variant:
    """One pruned copy: ``pruner`` to ``target`` (``"70%"`` or ``"2:4"``), OWL or uniform."""

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

    @property
    def shown(self) -> str:
        """As a sentence writes it: ``"SparseGPT with OWL to 70%"``."""
        return f"{PRUNER_NAMES[self.pruner]}{' with OWL' if self.owl else ''} to {self.target}"


def variants(labels: tuple[str, ...] | list[str]) -> tuple[Variant, ...]:
    """The variants named by their labels, one error sentence for a malformed one."""
    found = []
    for label in labels:
        parts = label.split()
        owl = len(parts) == 3 and parts[1] == "owl"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not owl):
            raise ValueError(f"a variant is 'PRUNER TARGET' or 'PRUNER owl TARGET', got {label!r}")
        if parts[0] not in PRUNER_NAMES:
            raise ValueError(
                f"a variant's pruner must be magnitude, wanda or sparsegpt, got {parts[0]!r}"
            )
        found.append(Variant(parts[0], parts[-1], owl))
    return tuple(found)


def shown_variant(label: str) -> str:
    """``"sparsegpt owl 70%" -> "SparseGPT with OWL to 70%"``."""
    return variants((label,))[0].shown


ALL_VARIANTS = tuple(f"{p} {t}" for t in ("50%", "70%", "2:4") for p in PRUNER_NAMES)
ALL_VARIANTS += ("wanda owl 70%", "sparsegpt owl 70%")


@dataclass(frozen=True)
class FinetuneConfig:
    """Part (c)'s settings (its fields key its units: keep their names and order).

    Attributes:
        selection_seed, seeds: the grid points' seed (validation) and the final runs' (test).
        horst_strengths, horst_lrs, adamw_lrs, adamw_weight_decays: the two equal-size grids.
        horst_weight_decay, horst_beta: HORST's fixed weight decay (matrices) and L1 shrinkage.
        steps, batch_size, max_length: the fine-tune (5 % warm-up, cosine, clip 1.0).
        layers: MiniLM's first layers kept (None: all 6).
        validation_sentences, test_sentences: evaluation subsets (None: all 1,056).
        calibration_sentences: training sentences Wanda, SparseGPT and OWL calibrate on.
        readout_lr: the readout-only fine-tune's lr (AdamW on the head alone).
        variants: the pruned copies of the final runs (the selection reads SELECTION_VARIANT).
        extension_rounds: equal grid extensions while a selection lies on an edge.
        workers, threads: processes running units side by side, torch threads in each.
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
        if SELECTION_VARIANT not in self.variants:
            raise ValueError(
                f"variants must include {SELECTION_VARIANT!r}, which the selection reads, got "
                f"{list(self.variants)}"
            )
        for variant in variants(self.variants):
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
        if name == "horst":
            return {"weight_decay": self.horst_weight_decay, "beta": self.horst_beta, **point}
        return dict(point)

    @classmethod
    def for_mode(cls, mode: str) -> FinetuneConfig:
        check_mode(mode)
        return cls(mode=mode, **FINETUNE_PRESETS[mode])


def finetune_settings(study: Any) -> FinetuneConfig:
    """Part (c)'s settings at the study's mode, with its seeds, selection seed, workers and
    threads (``--seeds`` reaches part (c) too; full: selection seed 20, final seeds 21-25)."""
    return dataclasses.replace(
        FinetuneConfig.for_mode(study.mode),
        seeds=tuple(study.seeds),
        selection_seed=study.selection_seed,
        workers=study.workers,
        threads=study.threads,
    )


# Declared before part (c)'s first run (docs/studies.md, "sparsity part (c)"). Full: the
# regime pilot (one seed, AdamW at lr 5e-5, 150 steps of 32 sentences) left AdamW room at every
# target (2.4 to 30 points lost); HORST's strengths span the check's floor (0.2) to far above
# it, AdamW's lrs the usual range around 5e-5; 8 points each. Quick: a one-point preview.
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


DENSE_MARGIN = 0.02
SELECTION = (
    "each at the point its grid selected on validation after SparseGPT to 70 % (HORST "
    "points selectable at a move ratio of at least 0.3)"
)
HERE = "(here: rt-sentences, {selection}, paired over seeds and test sentences{survives})"
UNIT = "test accuracy, HORST minus AdamW (fraction)"
EVIDENCE = "test accuracy per seed (%): HORST {horst}; AdamW {adamw}.{resolved}"
REVISED = "design 4: new, part (c)"
# Each claim's effect: HORST minus AdamW correct per test sentence, paired by seed and sentence.
DENSE = ClaimSpec(
    "sparsity.finetune_dense_accuracy_same",
    "(c) A HORST fine-tune of pretrained MiniLM-L6 keeps the same dense test accuracy as an "
    f"AdamW fine-tune, within {100 * DENSE_MARGIN:g} points either way {HERE}",
    within(-DENSE_MARGIN, DENSE_MARGIN),
    UNIT,
    EVIDENCE,
    REVISED,
    ("move", "moved"),
    DENSE_MARGIN,
    paired=True,
)
PRUNED = ClaimSpec(
    "sparsity.finetune_horst_keeps_accuracy_{tag}",
    "(c) After one-shot {shown}, a HORST fine-tune of pretrained MiniLM-L6 keeps more test "
    f"accuracy than an AdamW fine-tune {HERE}",
    at_least(0.0),
    UNIT,
    EVIDENCE,
    REVISED,
    ("move", "room", "moved"),
    paired=True,
)
DENSE_KEY = DENSE.key
STRONGER = "sparsegpt 70%"  # the claim that also carries "survives a stronger pruner"
SURVIVES = (
    "; this is also the test of whether HORST's advantage survives a pruner that updates the "
    "kept weights"
)
CROSSED = "crossed: two-way interval over test sentences and seeds, paired"
RESOLVED = (
    " The design resolves a difference of {half:.2f} points (the interval's half-width at "
    "{sentences} sentences x {seeds} seeds)."
)
UNRESOLVED = " One seed: no interval, so the design resolves no difference."


def variant_tag(label: str) -> str:
    """A variant label in a claim key: ``"sparsegpt owl 70%" -> "sparsegpt_owl_70"``."""
    return label.replace("%", "").replace(":", "of").replace(" ", "_")


def finetune_key(label: str) -> str:
    """The key of the claim that a HORST fine-tune keeps more accuracy after ``label``."""
    return PRUNED.key.format(tag=variant_tag(label))


CHECKS = {
    "move": CheckWords(
        "HORST mirror move / Adam move (final fine-tunes, mean over runs)",
        at_least(acting.MOVE_RATIO_FLOOR),
        "below 0.2 the mirror step moves the weights less than a fifth as far as the Adam step: "
        "HORST is AdamW in all but name. Runs: {runs}.",
    ),
    "room": CheckWords(
        "AdamW loses at least 2 points from dense to {shown} (mean over seeds)",
        at_least(0.02),
        "where AdamW's fine-tune barely loses accuracy, no optimizer can show a smaller loss",
    ),
    "moved": CheckWords(
        "the fine-tune moved the model: selected points' dense validation accuracy minus the "
        "readout-only run's (the smaller of AdamW's and HORST's)",
        at_least(0.05),
        "MiniLM with its readout trained alone: {readout:.2f} % on validation; a fine-tune "
        "within 5 points of it has barely changed the encoder the pruners read",
    ),
}

# The plain sentences (`brief.finetune_sentences`, `finetune_brief`, `finetune_advice`), by case.
WORDS = {
    "setting": "HORST(strength={strength:g}, lr={lr:g})",
    "sure": "Fine-tune a pretrained model with {setting} before pruning with {shown}: it kept "
    "that much more test accuracy than an AdamW fine-tune",
    "helped": "A fine-tune with {setting} kept more test accuracy than an AdamW fine-tune after "
    "{shown}, but not after Holm over the {size} claims tested together: {not_established}",
    "no gain": "No gain from a HORST fine-tune before pruning at this scale (MiniLM-L6)",
    "unknown": "Whether a HORST fine-tune helps before pruning is not known from this run: a "
    "manipulation check failed in every pruned setting (see the claims table)",
    "worse": "it did worse after {shown}",
    "open": "{count} of the {total} pruned settings were inconclusive",
    "untested": "{count} untested (a check failed)",
    "dense same": "dense accuracy stayed within 2 points",
    "dense other": "dense accuracy within 2 points: {verdict}",
    "brief sure": "Fine-tune with HORST before pruning with {shown}: it kept more accuracy than "
    "AdamW (reproduced){same}",
    "brief helped": "After {shown}, a HORST fine-tune kept more accuracy than AdamW (reproduced, "
    "but not after Holm over {size} claims: {not_established}){same}",
    "brief same": ", at the same dense accuracy ({verdict})",
    "brief others": "; not shown for the other {count} pruned settings",
    "advice method": "HORST fine-tune, then one-shot pruning",
    "advice helped": "you will prune a fine-tuned model with {shown}",
    "advice none": "not shown to help here: fine-tune with AdamW",
    "advice setting": "{setting} for the fine-tune, against AdamW",
    "advice unknown": "models larger than MiniLM-L6; tasks beyond sentiment",
    "advice stronger": "whether it helps before SparseGPT to 70 % ({verdict})",
    "advice scale": "pretrained MiniLM-L6 (6 layers, d_model 384) fine-tuned on rt-sentences",
}

# The report's two tables: their titles and the grid table's columns.
TABLES = {
    "runs": "(c) MiniLM fine-tune, pruned one-shot: test accuracy",
    "grid": "(c) grid",
    "dense": "validation accuracy dense (%)",
    "selection": "validation accuracy after SparseGPT 70 % (%)",
    "move": "move ratio (mirror / Adam)",
}
