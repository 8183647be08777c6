"""The acting check of descent constraints: do they bind, are they met, have they settled?

    constraint checked: f_l - (1 - alpha_l) f_{l-1} <= u_l, with lambda_l <- [lambda_l + eta_d
    * slack_l]_+

Every step's metrics carry lambda_l, slack_l and u_l (`dual_metrics`); the check counts the
steps with some lambda > 0, those after warm-up with every constraint met, and the largest
lambda at 4/5 of the run and at its end, and decides at the end of the run. The primal-dual
training step lives in `convergent.train.primal_dual` (it registers this check for its type).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from convergent.acting import ActingCheck

__all__ = [
    "ACTIVE_SHARE_FLOOR",
    "MULTIPLIER_FLOOR",
    "MULTIPLIER_GROWTH_LIMIT",
    "SATISFIED_SHARE_FLOOR",
    "WARMUP_FRACTION",
    "DescentCheck",
    "constraints_bind",
    "constraints_met",
    "multipliers_settled",
]

# Below 0.1 the constraint terms weigh less than a tenth of f_L in the Lagrangian (the descent
# study's check), and a constraint active in under a fifth of the steps barely changes training.
MULTIPLIER_FLOOR = 0.1
ACTIVE_SHARE_FLOOR = 0.2
# The first fifth of a run is warm-up: the constraints may still be far from met there.
WARMUP_FRACTION = 0.2
# After warm-up, every constraint met (slack_l <= u_l) in fewer than 1 step in 20: the
# constraints ask for more descent than training gives, and lambda only grows.
SATISFIED_SHARE_FLOOR = 0.05
# The largest lambda still rising by more than a tenth over the last fifth of the run (one that
# grows steadily from zero rises by a quarter there): the dual ascent has not settled, so the
# run ends before its constrained solution.
MULTIPLIER_GROWTH_LIMIT = 1.1


def constraints_bind(largest_multiplier: float, active_share: float) -> ActingCheck:
    """The descent constraints bound: the largest lambda reached `MULTIPLIER_FLOOR` and some
    lambda was positive in at least `ACTIVE_SHARE_FLOOR` of the steps. A failed check reports
    the floor it missed (the multiplier's when both are missed)."""
    strong = largest_multiplier >= MULTIPLIER_FLOOR
    often = active_share >= ACTIVE_SHARE_FLOOR
    if strong and not often:  # only the share missed: it is the value reported
        value, floor = active_share, ACTIVE_SHARE_FLOOR
        advice = "they were active in too few steps to change the training much"
    else:
        value, floor = largest_multiplier, MULTIPLIER_FLOOR
        advice = "they barely bound, this is ERM in all but name"
    return ActingCheck(
        "descent",
        "constraints_bind",
        value,
        floor,
        strong and often,
        f"the descent constraints' largest lambda was {largest_multiplier:.3g} (they bind "
        f"from {MULTIPLIER_FLOOR:g}), some lambda > 0 in {100 * active_share:.0f} % of the "
        f"steps (from {100 * ACTIVE_SHARE_FLOOR:g} %)",
        f"{advice}; ask for more descent per layer (raise alpha) or raise dual_lr.",
    )


def constraints_met(satisfied_share: float, steps: int) -> ActingCheck:
    """After warm-up, every constraint was met (slack_l <= u_l) in at least
    `SATISFIED_SHARE_FLOOR` of the steps."""
    return ActingCheck(
        "descent",
        "constraints_met",
        satisfied_share,
        SATISFIED_SHARE_FLOOR,
        not satisfied_share < SATISFIED_SHARE_FLOOR,
        f"the descent constraints were all met in {100 * satisfied_share:.3g} % of the "
        f"{steps} steps after warm-up (from {100 * SATISFIED_SHARE_FLOOR:g} %)",
        "they ask for more descent than training gives; lower alpha, or relax them "
        "(resilient_cost).",
    )


def multipliers_settled(at_four_fifths: float, at_end: float) -> ActingCheck:
    """The largest lambda rose by at most `MULTIPLIER_GROWTH_LIMIT` over the run's last fifth
    (or stayed below `MULTIPLIER_FLOOR`, where its growth does not matter)."""
    value = at_end / at_four_fifths if at_four_fifths > 0 else (math.inf if at_end > 0 else 1.0)
    acted = at_end < MULTIPLIER_FLOOR or not value > MULTIPLIER_GROWTH_LIMIT
    return ActingCheck(
        "descent",
        "multipliers_settled",
        value,
        MULTIPLIER_GROWTH_LIMIT,
        acted,
        f"the descent constraints' largest lambda went from {at_four_fifths:.3g} at 4/5 of "
        f"the run to {at_end:.3g} at its end ({value:.3g}x; settled is at most "
        f"{MULTIPLIER_GROWTH_LIMIT:g}x)",
        "the multipliers were still growing; train longer, or raise dual_lr.",
    )


class DescentCheck:
    """The acting check of descent-constrained training (a `convergent.acting.MethodCheck`).

    Args:
        num_layers: L, the constraints (``lambda_1`` .. ``lambda_L`` in the metrics).
        max_steps: the run's length in optimizer steps.
    """

    proofs = ("constraints_bind",)

    def __init__(self, num_layers: int, max_steps: int) -> None:
        self.layers = range(1, num_layers + 1)
        self.max_steps = max_steps
        # steps seen, steps with some lambda > 0, steps after warm-up and those with every
        # constraint met
        self.descent_counts = {"steps": 0, "active": 0, "late": 0, "met": 0}
        self.largest_multiplier = 0.0
        self.multiplier_at_four_fifths: float | None = None
        self.multiplier_now = 0.0

    def introduce(self, train_data: Any, task: str) -> str | None:
        return None

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[ActingCheck]:
        """Counts step ``step``'s multipliers and slacks, read from its metrics."""
        layers = self.layers
        multipliers = [float(metrics[f"lambda_{i}"]) for i in layers if f"lambda_{i}" in metrics]
        if not multipliers:
            return []
        counts = self.descent_counts
        counts["steps"] += 1
        self.multiplier_now = max(multipliers)
        self.largest_multiplier = max(self.largest_multiplier, self.multiplier_now)
        counts["active"] += int(self.multiplier_now > 0)
        if step >= math.ceil(0.8 * self.max_steps) and self.multiplier_at_four_fifths is None:
            self.multiplier_at_four_fifths = self.multiplier_now
        if step > WARMUP_FRACTION * self.max_steps and all(f"slack_{i}" in metrics for i in layers):
            counts["late"] += 1
            counts["met"] += int(
                all(
                    float(metrics[f"slack_{i}"]) <= float(metrics.get(f"u_{i}", 0.0))
                    for i in layers
                )
            )
        return []

    def read(self, step: int) -> tuple[dict[str, float], list[ActingCheck]]:
        return {}, []

    def decide(
        self,
        step: int,
        losses: Sequence[tuple[int, float]],
        final: bool,
        model: nn.Module | None,
    ) -> list[ActingCheck]:
        counts = self.descent_counts
        if not final or not counts["steps"]:
            return []
        checks = [constraints_bind(self.largest_multiplier, counts["active"] / counts["steps"])]
        if counts["late"]:
            checks.append(constraints_met(counts["met"] / counts["late"], counts["late"]))
        if self.multiplier_at_four_fifths is not None:
            checks.append(multipliers_settled(self.multiplier_at_four_fifths, self.multiplier_now))
        return checks

    def state_dict(self) -> dict[str, Any]:
        return {
            "descent_counts": dict(self.descent_counts),
            "largest_multiplier": self.largest_multiplier,
            "multiplier_at_four_fifths": self.multiplier_at_four_fifths,
            "multiplier_now": self.multiplier_now,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.descent_counts = {key: int(value) for key, value in state["descent_counts"].items()}
        self.largest_multiplier = float(state["largest_multiplier"])
        four_fifths = state["multiplier_at_four_fifths"]
        self.multiplier_at_four_fifths = None if four_fifths is None else float(four_fifths)
        self.multiplier_now = float(state["multiplier_now"])
