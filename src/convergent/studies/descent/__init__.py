"""Study ``descent``: layer-wise descent constraints against ERM (Porras-Valenzuela, Hadou,
Ribeiro, 2026, "A Constrained Optimization Perspective of Unrolled Transformers").

(a) MiniLM-L6 fine-tuned on rt-sentences: clean test accuracy, accuracy under token-embedding
    perturbations (Gaussian, uniform, discrete) and under text shifts applied before
    tokenization (character typos, word dropout), per-layer test losses.
(b) An unrolled Transformer denoiser on patches of street-video frames, trained at one noise
    level: test RMSE up to 3x the training level, and per-layer losses.

Both parts select each method's point on its declared grid (validation only), then train the
selected points from every final seed and score them once on test; every constrained run
records its multipliers and slacks over training, the manipulation check of every claim.
Modules: ``config`` (settings, grids, modes, the selection rules), ``study`` (the run),
``runs`` (one unit: data, training, measuring), ``models``, ``measures`` (also the clean
claim's intervals over sentences and seeds), ``claims`` (the current design's scorer),
``report``, ``summary`` (the plain sentences opening the report) and ``pilot`` (the
denoiser-depth pilot, validation frames only). Run with ``convergent reproduce
descent --mode quick`` (or ``smoke``, ``full``).
"""

from __future__ import annotations

from convergent.studies.descent.claims import DESIGN, claims_from_results
from convergent.studies.descent.config import Config
from convergent.studies.descent.pilot import run_pilot
from convergent.studies.descent.study import run
from convergent.studies.descent.summary import summary

__all__ = ["DESIGN", "Config", "claims_from_results", "run", "run_pilot", "summary"]
