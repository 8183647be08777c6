"""The regularized training step: the task loss plus a penalty on some of the weights.

    objective = task_loss(model(inputs), labels) + regularizer()

The regularizer is usually a :class:`~convergent.regularize.VillaniRegularizer` (a Villani
penalty on W_Q, W_K or on LoRA factors, for Langevin training), but any callable returning a
scalar tensor will do; one with a ``norms()`` method also has its norms logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from convergent.losses import check_task, task_loss
from convergent.train.steps import split_batch


class RegularizedStep:
    """A :class:`~convergent.train.steps.TrainingStep`: the task loss plus a regularizer's penalty.

    Metrics: ``"loss"`` (the task loss), ``"penalty"``, ``"objective"`` (their sum), and after
    each optimizer step ``"norm/<name>"`` for every penalized matrix.

    Args:
        task: ``"classification"``, ``"regression"`` or ``"lm"``.
        regularizer: any callable returning a scalar tensor;
            :class:`~convergent.regularize.VillaniRegularizer` also reports norms.
    """

    def __init__(self, task: str, regularizer: Callable[[], torch.Tensor]) -> None:
        self.task = check_task(task)
        self.regularizer = regularizer

    def loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        inputs, labels = split_batch(batch)
        task_value = task_loss(model(**inputs).logits, labels, self.task)
        penalty_value = self.regularizer()
        objective = task_value + penalty_value
        return objective, {
            "loss": float(task_value.detach()),
            "penalty": float(penalty_value.detach()),
            "objective": float(objective.detach()),
        }

    def after_optimizer_step(self, model: nn.Module) -> dict[str, float]:
        norms = getattr(self.regularizer, "norms", None)
        return {f"norm/{name}": value for name, value in norms().items()} if norms else {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
