"""Callbacks for :func:`~convergent.train.fit` that report on the optimizer."""

from __future__ import annotations

import logging
from typing import Any

from convergent.optim import HORST, horst_move_ratio, horst_strength

logger = logging.getLogger(__name__)

__all__ = ["HorstStrengthLog"]


class HorstStrengthLog:
    """Logs how strongly HORST's mirror step acts, at every evaluation and at the end.

    One line: the measured mirror/AdamW move ratio of the next step and, per param group,
    alpha * mean |theta| (its first-order estimate). Below about 0.2 the mirror step barely
    changes what AdamW does; raise alpha (its effect scales with the weights' magnitude).
    The values are kept in ``records`` as ``(step, ratio, [alpha * mean |theta| per group])``.
    """

    def __init__(self, optimizer: HORST) -> None:
        self.optimizer = optimizer
        self.records: list[tuple[int, float, list[float]]] = []

    def _log(self, step: int) -> None:
        ratio = horst_move_ratio(self.optimizer)
        strengths = [row["alpha_times_mean_abs"] for row in horst_strength(self.optimizer)]
        self.records.append((step, ratio, strengths))
        logger.info(
            "step %d: HORST mirror/AdamW move ratio %.3g; alpha x mean|theta| per group: %s",
            step,
            ratio,
            ", ".join(f"{value:.3g}" for value in strengths),
        )

    def on_evaluate(self, step: int, metrics: dict[str, Any]) -> None:
        self._log(step)

    def on_fit_end(self, result: Any) -> None:
        if not self.records or self.records[-1][0] != result.step:
            self._log(result.step)
