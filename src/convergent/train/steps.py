"""Training steps: what the loop differentiates and what runs after each optimizer step.

The loop owns the mechanics (batches, backward, clipping, the optimizer, checkpoints); a
training step owns the objective. Empirical risk minimization is :class:`ErmStep`. The
pillars bring their own steps with the same surface (a primal-dual step that does dual
ascent after each primal step, a masked step that re-applies sparsity masks, ...).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from convergent.losses import check_task, task_loss


@runtime_checkable
class TrainingStep(Protocol):
    """The surface the training loop needs from a step."""

    def loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar to differentiate for ``batch``, and metrics worth logging."""
        ...

    def after_optimizer_step(self, model: nn.Module) -> dict[str, float]:
        """Work after ``optimizer.step()`` (dual ascent, re-masking); returns metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State that must round-trip through a checkpoint."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...


def split_batch(
    batch: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Separate a batch into model inputs and ``labels``."""
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    return inputs, batch["labels"]


class ErmStep:
    """Empirical risk minimization: the task loss of the model's output.

    Args:
        task: ``"classification"``, ``"regression"`` or ``"lm"``.
    """

    def __init__(self, task: str) -> None:
        self.task = check_task(task)

    def loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        inputs, labels = split_batch(batch)
        output = model(**inputs)
        value = task_loss(output.logits, labels, self.task)
        return value, {"loss": float(value.detach())}

    def after_optimizer_step(self, model: nn.Module) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
