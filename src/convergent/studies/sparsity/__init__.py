"""Study ``sparsity``: does HORST train weights that survive pruning (Jacobs, Jain, Burkholz, 2026)?

Claims: at 90 % sparsity HORST keeps more top-1 accuracy than AdamW and than HAM, loses at most
half of AdamW's accuracy at 80-90 %, concentrates its weights near zero (in the ViT and in the
LM), and a HORST-trained character language model survives one-shot pruning (magnitude, Wanda
and SparseGPT, at 70 and 90 %) better than an AdamW-trained one. Each
optimizer's equal-size grid is selected on validation with the selection seed; the selected
configurations are scored on test from disjoint final seeds.

Parts: ``config`` (the settings, the modes as data, the selection rules), ``models`` (the ViT on
Fashion-MNIST patches, the Austen character LM, their data), ``runs`` (one unit: training with
AC/DC or densely, pruning, measuring), ``measures`` (pruned perplexities, the near-zero share),
``study`` (the selection and final runs, for the framework's run), ``checks`` (every part's
manipulation checks as records), ``claims`` (the current design's scorer), ``report`` and
``plots`` (tables, notes, figures), ``summary`` and ``brief`` (the plain sentences a user acts
on, from the verdicts), ``wording`` (the claim roles and words they share) and ``pilot`` (the
regime pilot behind the full mode's ViT). Part (c) is a spec, ``finetune_config`` (its
settings, claims, checks and words as records), and a measure, ``finetune_runs``.
"""

from __future__ import annotations

from convergent.studies.sparsity.brief import advice, brief
from convergent.studies.sparsity.claims import DESIGN, claims_from_results
from convergent.studies.sparsity.config import PRESETS, Config
from convergent.studies.sparsity.models import language_model, subset, vision_model
from convergent.studies.sparsity.pilot import run_pilot
from convergent.studies.sparsity.study import STUDY, SparsityStudy, pruned_score_of_good_dense
from convergent.studies.sparsity.summary import summary

__all__ = [
    "DESIGN",
    "PRESETS",
    "STUDY",
    "Config",
    "SparsityStudy",
    "advice",
    "brief",
    "claims_from_results",
    "language_model",
    "pruned_score_of_good_dense",
    "run_pilot",
    "subset",
    "summary",
    "vision_model",
]
