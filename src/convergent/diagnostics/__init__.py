"""Convergence diagnostics: layer-wise losses (more arrive with the residual pillar)."""

from .layerwise import (
    MonotonicityReport,
    layerwise_losses,
    losses_from_hidden_states,
    monotonicity_report,
)

__all__ = [
    "MonotonicityReport",
    "layerwise_losses",
    "losses_from_hidden_states",
    "monotonicity_report",
]
