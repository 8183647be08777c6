"""HORST's and HAM's acting check: does the mirror step move the weights, and stay finite?

The mirror move is about alpha * |theta| * u, so at a small alpha (or small weights) HORST is
AdamW in all but name. Every reading measures the mirror/base move ratio of the next step
(`horst_move_ratio`, `ham_move_ratio`); the check decides on their mean against
`MOVE_RATIO_FLOOR`. HAM's weights must also stay finite (`ham_finite`, at every reading): its
mirror factor exp(lr * alpha * |grad|) overflows for a large gradient.

    update rule checked: theta_next = theta_half * exp(-alpha * sign(theta_half) * u - lr * beta)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from convergent.acting import ActingCheck, RunShape, register_check
from convergent.optim import _sharding
from convergent.optim.ham import HAM
from convergent.optim.horst import HORST
from convergent.optim.strength import ham_move_ratio, horst_move_ratio

__all__ = ["MOVE_RATIO_FLOOR", "MirrorCheck", "ham_finite", "mirror_acts"]

# Below a fifth, the mirror step moves the weights less than a fifth as far as the Adam (base)
# step does: HORST (HAM) is AdamW in all but name. The sparsity study's check.
MOVE_RATIO_FLOOR = 0.2


def _mean(values: Sequence[float]) -> float:
    finite = [float(value) for value in values if math.isfinite(value)]
    return sum(finite) / len(finite) if finite else math.nan


def mirror_acts(method: str, ratios: Sequence[float], setting: str) -> ActingCheck:
    """HORST's or HAM's mirror step moved the weights at least `MOVE_RATIO_FLOOR` as far as
    its base step, on average over the readings.

    Args:
        method: ``"HORST"`` or ``"HAM"``.
        ratios: the readings of `horst_move_ratio` or `ham_move_ratio` (NaN readings, of steps
            that moved nothing, are left out).
        setting: how the strength is set now, e.g. ``"strength 0.2"`` or ``"alpha 1"``, named in
            the message.
    """
    value = _mean(ratios)
    acted = not value < MOVE_RATIO_FLOOR  # NaN: nothing was read, nothing to warn about
    base = "AdamW" if method == "HORST" else "its base optimizer"
    knob = "strength" if setting.startswith("strength") else "alpha, or give strength instead"
    return ActingCheck(
        method,
        "mirror_acts",
        value,
        MOVE_RATIO_FLOOR,
        acted,
        f"{method}'s mirror step moved the weights {100 * value:.3g} % as far as its "
        f"{'Adam' if method == 'HORST' else 'base'} step (mean of {len(ratios)} readings; "
        f"it acts from {100 * MOVE_RATIO_FLOOR:g} %)",
        f"it is acting as {base}; raise {knob} (now {setting}).",
    )


def ham_finite(nonfinite_tensors: int, exponent: float) -> ActingCheck:
    """HAM's steps left every weight finite.

    Args:
        nonfinite_tensors: how many mirrored tensors hold a NaN or an infinity.
        exponent: the largest lr * alpha * |grad| read (HAM multiplies a weight by up to
            exp of it in one step), named in the message.
    """
    return ActingCheck(
        "HAM",
        "ham_finite",
        float(nonfinite_tensors),
        0.0,
        nonfinite_tensors == 0,
        f"HAM's mirror step left {nonfinite_tensors} weight tensor(s) non-finite (largest "
        f"lr x alpha x |grad| read: {exponent:.3g}; one step multiplies a weight by up to "
        "exp of it)",
        "lower alpha or the learning rate.",
    )


class MirrorCheck:
    """The acting check of a HORST or HAM optimizer (a `convergent.acting.MethodCheck`).

    Args:
        optimizer: the run's HORST or HAM.
    """

    proofs = ("mirror_acts",)

    def __init__(self, optimizer: HORST | HAM) -> None:
        self.optimizer = optimizer
        self.method = "HAM" if isinstance(optimizer, HAM) else "HORST"
        self.ratios: list[float] = []
        self.largest_exponent = 0.0  # HAM: the largest lr * alpha * |grad| read

    def move_ratio(self) -> float:
        """The mirror/base move ratio of the next step (`horst_move_ratio`, `ham_move_ratio`)."""
        if isinstance(self.optimizer, HAM):
            return ham_move_ratio(self.optimizer)
        return horst_move_ratio(self.optimizer)

    def setting(self) -> str:
        """How the strength is set now, as the warning names it."""
        group = self.optimizer.param_groups[0]
        if isinstance(self.optimizer, HAM):
            return f"alpha {float(group['ham_alpha']):g}"
        if group.get("strength") is not None:
            return f"strength {float(group['strength']):g}"
        return f"alpha {float(group['alpha'] or 0.0):g}"

    def introduce(self, train_data: Any, task: str) -> str | None:
        return None

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[ActingCheck]:
        return []

    def read(self, step: int) -> tuple[dict[str, float], list[ActingCheck]]:
        ratio = self.move_ratio()
        if math.isfinite(ratio):
            self.ratios.append(ratio)
        failed = [self._finite()] if isinstance(self.optimizer, HAM) else []
        return {"mirror_move_ratio": ratio}, failed

    def decide(
        self,
        step: int,
        losses: Sequence[tuple[int, float]],
        final: bool,
        model: nn.Module | None,
    ) -> list[ActingCheck]:
        if not self.ratios:
            return []
        return [mirror_acts(self.method, self.ratios, self.setting())]

    def _finite(self) -> ActingCheck:
        nonfinite = 0
        for group in self.optimizer.param_groups:
            alpha, lr = float(group["ham_alpha"]), float(group["lr"])
            for param in group["params"]:
                mirrored = param.ndim >= 2 if group["ham_mirror"] is None else group["ham_mirror"]
                if not mirrored:
                    continue
                local = _sharding.local(param.detach())
                if not bool(torch.isfinite(local).all()):
                    nonfinite += 1
                if param.grad is not None and param.grad.numel():
                    grad = _sharding.local(param.grad)
                    largest = float(grad.detach().abs().max())
                    self.largest_exponent = max(self.largest_exponent, lr * alpha * largest)
        return ham_finite(nonfinite, self.largest_exponent)

    def state_dict(self) -> dict[str, Any]:
        return {"ratios": list(self.ratios), "largest_exponent": self.largest_exponent}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ratios = [float(value) for value in state["ratios"]]
        self.largest_exponent = float(state["largest_exponent"])


def _mirror_checks(optimizer: Optimizer, run: RunShape) -> list[MirrorCheck]:
    return [MirrorCheck(optimizer)]  # type: ignore[arg-type]


register_check(HORST, _mirror_checks)
register_check(HAM, _mirror_checks)
