"""Layer-wise losses through the model's one shared readout, and a monotonicity report.

With hidden states H_0 (embedding output) .. H_L and the shared head ``readout``, the
layer-wise loss is f_l = loss(readout(H_l), y). The descent pillar constrains these; the
residual pillar and ``convergent diagnose`` report them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from convergent.losses import losses_from_hidden_states
from convergent.models import unwrap_model


def layerwise_losses(
    model: nn.Module, batch: dict[str, torch.Tensor], task: str | None = None
) -> torch.Tensor:
    """Per-layer losses f_0 .. f_L of ``model`` on ``batch`` (differentiable).

    Args:
        model: a convergent model (or a DDP wrapper of one) with ``readout`` and hidden states.
        batch: inputs plus ``labels``.
        task: defaults to ``model.task``.
    """
    inner = unwrap_model(model)
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    output = model(**inputs, output_hidden_states=True)
    if output.hidden_states is None:
        raise ValueError(f"{type(inner).__name__} returned no hidden states")
    return losses_from_hidden_states(
        inner.readout,
        output.hidden_states,
        batch["labels"],
        task or inner.task,
        inputs.get("attention_mask"),
    )


@dataclass(frozen=True)
class MonotonicityReport:
    """How well per-layer losses descend.

    Attributes:
        losses: f_0 .. f_L.
        satisfied: per layer l = 1..L, whether f_l <= (1 - alpha_l) f_{l-1}.
        fraction_satisfied: the share of layers whose constraint holds.
        is_monotone: every constraint holds.
        largest_increase: max over l of f_l - f_{l-1} (negative when losses fall throughout).
    """

    losses: tuple[float, ...]
    satisfied: tuple[bool, ...]
    fraction_satisfied: float
    is_monotone: bool
    largest_increase: float


def monotonicity_report(
    losses: Sequence[float] | torch.Tensor, alpha: float | Sequence[float] = 0.0
) -> MonotonicityReport:
    """Check f_l <= (1 - alpha_l) f_{l-1} for l = 1..L.

    Args:
        losses: f_0 .. f_L (at least two values).
        alpha: the required relative decrease per layer, one value or L values in [0, 1).
    """
    values = [float(v) for v in (losses.tolist() if isinstance(losses, torch.Tensor) else losses)]
    if len(values) < 2:
        raise ValueError(f"need the losses of at least two layers, got {len(values)}")
    count = len(values) - 1
    alphas = [float(alpha)] * count if isinstance(alpha, int | float) else [float(a) for a in alpha]
    if len(alphas) != count:
        raise ValueError(f"alpha has {len(alphas)} values; expected one per layer ({count})")
    for a in alphas:
        if not 0 <= a < 1:
            raise ValueError(f"alpha must be in [0, 1), got {a}")
    satisfied = tuple(
        values[i] <= (1 - alphas[i - 1]) * values[i - 1] for i in range(1, len(values))
    )
    increases = [values[i] - values[i - 1] for i in range(1, len(values))]
    return MonotonicityReport(
        losses=tuple(values),
        satisfied=satisfied,
        fraction_satisfied=sum(satisfied) / count,
        is_monotone=all(satisfied),
        largest_increase=max(increases),
    )
