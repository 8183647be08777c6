"""Convergence diagnostics: attention-output spectra, rank collapse, rate fits and
convergence-bound tests of loss curves, layer-wise losses and weight statistics.

Everything here is a pure function of a model, a batch or a curve, plus one hook object
(`SpectraRecorder`) for measuring during training. Nothing here imports training code; the
``convergent diagnose`` command lives in `convergent.commands.diagnose`.
"""

from convergent.diagnostics import acting
from convergent.diagnostics.convergence import (
    BandSlope,
    EnvelopeTest,
    band_log_slope,
    geometric_envelope,
    smallest_envelope_rate,
    steps_to_reach,
)
from convergent.diagnostics.layerwise import (
    MonotonicityReport,
    layerwise_losses,
    monotonicity_report,
)
from convergent.diagnostics.rank import layerwise_rank_collapse, rank_collapse
from convergent.diagnostics.rates import (
    FloorFit,
    RateFit,
    fit_linear_rate,
    fit_rate_with_floor,
    fit_saturation,
)
from convergent.diagnostics.spectra import (
    AttentionSite,
    AttentionSpectra,
    SpectraRecorder,
    attention_spectra,
    condition_number,
    find_attention_sites,
    singular_value_extremes,
    singular_values,
)
from convergent.diagnostics.villani import flat_potential, villani_along_ray, villani_quantity
from convergent.diagnostics.weights import query_key_norms, weight_matrices, weight_statistics
from convergent.losses import losses_from_hidden_states

__all__ = [
    "AttentionSite",
    "AttentionSpectra",
    "BandSlope",
    "EnvelopeTest",
    "FloorFit",
    "MonotonicityReport",
    "RateFit",
    "SpectraRecorder",
    "acting",
    "attention_spectra",
    "band_log_slope",
    "condition_number",
    "find_attention_sites",
    "fit_linear_rate",
    "fit_rate_with_floor",
    "fit_saturation",
    "flat_potential",
    "geometric_envelope",
    "layerwise_losses",
    "layerwise_rank_collapse",
    "losses_from_hidden_states",
    "monotonicity_report",
    "query_key_norms",
    "rank_collapse",
    "singular_value_extremes",
    "singular_values",
    "smallest_envelope_rate",
    "steps_to_reach",
    "villani_along_ray",
    "villani_quantity",
    "weight_matrices",
    "weight_statistics",
]
