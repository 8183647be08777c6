"""Study ``descent``: layer-wise descent constraints against ERM (Porras-Valenzuela, Hadou,
Ribeiro, 2026, "A Constrained Optimization Perspective of Unrolled Transformers").

(a) MiniLM-L6 fine-tuned on rt-sentences: clean test accuracy, accuracy under token-embedding
    perturbations (Gaussian, uniform, discrete) and under text shifts applied before
    tokenization (character typos, word dropout), per-layer test losses.
(b) An unrolled Transformer denoiser on patches of street-video frames, trained at one noise
    level: test RMSE up to 3x the training level, and per-layer losses.
(c) A GPT-style language model pretrained on Jane Austen and fine-tuned on held-apart text
    (the paper's Llama claim at a CPU's size): the win rate against ERM per test window,
    clean and under Gaussian embedding noise, perplexities, per-layer losses through the LM
    head (``Config.run_language``).

Every part selects each method's point on its declared grid (validation only), then trains
the selected points from every final seed and scores them once on test; every constrained run
records its multipliers and slacks over training, the manipulation check of every claim.
Modules: ``config`` (settings, grids, modes), ``study`` (the run), ``runs`` and
``language`` (the units of parts (a), (b) and (c)), ``models``, ``measures``, ``selection``,
``checks`` (the claims' keys and shared parts), ``claims``, ``language_claims``, ``report``,
``summary``, ``language_summary``, ``wording`` and ``brief`` (the words), ``pilot``.
Run with ``convergent reproduce descent --quick`` (or ``--smoke``, ``--full``; ``--pilot``).
"""

from __future__ import annotations

from convergent.studies.descent.brief import advice, brief
from convergent.studies.descent.claims import DESIGN, claims_from_results
from convergent.studies.descent.config import Config
from convergent.studies.descent.pilot import run_language_pilot, run_pilot
from convergent.studies.descent.study import STUDY, DescentStudy
from convergent.studies.descent.summary import summary

__all__ = [
    "DESIGN",
    "STUDY",
    "Config",
    "DescentStudy",
    "advice",
    "brief",
    "claims_from_results",
    "run_language_pilot",
    "run_pilot",
    "summary",
]
