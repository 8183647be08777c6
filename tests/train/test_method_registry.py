"""A method brings its own acting check: a toy optimizer, defined and registered here (as a new
method would be beside its code), is checked by `fit` with no edit to convergent.train.

The toy, `Nudge`, is SGD plus a shrinking step: w <- w - lr * grad - lr * shrink * sign(w).
Its check reads how far the shrink moved the weights against the gradient step, and warns
when that is under a fifth. Expected values are computed here from the optimizer's own
formula, never by the check.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from convergent.acting import ActingCheck, MethodCheck, RunShape, register_check
from convergent.constrained import DescentCheck
from convergent.optim import HAM, HORST, MirrorCheck
from convergent.sparse import SparsityCheck
from convergent.train import MaskedStep, MethodChecks, fit
from convergent.train.primal_dual import descent_step
from tests.conftest import TinyClassifier, make_classification

FLOOR = 0.2


class Nudge(Optimizer):
    """SGD, then a shrink of every weight towards zero by lr * shrink."""

    def __init__(self, params: Any, lr: float, shrink: float) -> None:
        super().__init__(params, {"lr": lr, "shrink": shrink})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.add_(param.grad, alpha=-group["lr"])
                    param.add_(param.sign(), alpha=-group["lr"] * group["shrink"])


class NudgeCheck:
    """Does the shrink move the weights at least a fifth as far as the gradient step?"""

    proofs = ("shrink_acts",)

    def __init__(self, optimizer: Nudge) -> None:
        self.optimizer = optimizer
        self.ratios: list[float] = []

    def introduce(self, train_data: Any, task: str) -> str | None:
        return None

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[ActingCheck]:
        return []

    def read(self, step: int) -> tuple[dict[str, float], list[ActingCheck]]:
        shrink = gradient = 0.0
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                shrink += group["shrink"] ** 2 * float(param.detach().sign().square().sum())
                gradient += float(param.grad.detach().square().sum())
        self.ratios.append(math.sqrt(shrink / gradient))
        return {"shrink_ratio": self.ratios[-1]}, []

    def decide(
        self,
        step: int,
        losses: Sequence[tuple[int, float]],
        final: bool,
        model: nn.Module | None,
    ) -> list[ActingCheck]:
        value = sum(self.ratios) / len(self.ratios)
        return [
            ActingCheck(
                "Nudge",
                "shrink_acts",
                value,
                FLOOR,
                value >= FLOOR,
                f"Nudge's shrink moved the weights {value:.2g}x as far as its gradient step",
                "raise shrink.",
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"shrink_ratios": list(self.ratios)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ratios = list(state["shrink_ratios"])


def _nudge_checks(optimizer: Nudge, run: RunShape) -> list[MethodCheck]:
    return [NudgeCheck(optimizer)]


register_check(Nudge, _nudge_checks)


def _run(shrink: float):
    torch.manual_seed(0)
    model = TinyClassifier(dropout=0.0)
    optimizer = Nudge(model.parameters(), lr=0.1, shrink=shrink)
    result = fit(model, optimizer, make_classification(), max_steps=40, batch_size=16,
                 progress=False, tensorboard=False)  # fmt: skip
    return result


def test_fit_warns_once_when_a_registered_toy_method_is_inert(caplog):
    with caplog.at_level(logging.WARNING, logger="convergent.train.checks"):
        inert = _run(shrink=1e-6)
    assert [record["check"] for record in inert.warnings] == ["shrink_acts"]
    warning = inert.warnings[0]
    assert (warning["method"], warning["threshold"]) == ("Nudge", FLOOR)
    assert warning["value"] < 1e-3 and warning["message"].endswith(": raise shrink.")
    assert [record.getMessage() for record in caplog.records] == [warning["message"]]
    ratios = [r["shrink_ratio"] for r in inert.history if "shrink_ratio" in r]
    assert [r["step"] for r in inert.history if "shrink_ratio" in r] == list(range(2, 41, 2))
    # the shrink's size is lr * shrink per weight, whatever the gradient: 1e-6 of it is tiny
    assert max(ratios) < 1e-3 and inert.acting == []


def test_fit_confirms_a_registered_toy_method_that_acts():
    acting = _run(shrink=1.0)
    assert acting.warnings == []
    assert [line.split(":")[0] for line in acting.acting] == ["Nudge acts"]


def test_the_toy_method_is_found_by_type_and_its_state_round_trips():
    model = TinyClassifier()
    optimizer = Nudge(model.parameters(), lr=0.1, shrink=1.0)
    checks = MethodChecks(optimizer, max_steps=20)
    assert [type(check) for check in checks.checks] == [NudgeCheck]
    checks.checks[0].ratios.append(0.5)  # type: ignore[attr-defined]
    again = MethodChecks(optimizer, max_steps=20)
    again.load_state_dict(checks.state_dict())
    assert again.checks[0].ratios == [0.5]  # type: ignore[attr-defined]
    plain = MethodChecks(torch.optim.SGD(model.parameters(), lr=0.1), max_steps=20)
    assert plain.checks == []


def test_without_checks_the_toy_method_is_not_read():
    torch.manual_seed(0)
    model = TinyClassifier(dropout=0.0)
    result = fit(model, Nudge(model.parameters(), lr=0.1, shrink=1e-6), make_classification(),
                 max_steps=10, batch_size=16, progress=False, tensorboard=False,
                 checks=False)  # fmt: skip
    assert result.warnings == [] and not any("shrink_ratio" in r for r in result.history)


def test_a_masked_step_brings_its_base_steps_checks_after_the_optimizers():
    # the order in which a run reports: the optimizer's, the objective's, the masks'
    model = TinyClassifier()
    optimizer = HAM(torch.optim.AdamW(model.parameters(), lr=1e-3), alpha=20.0)
    descent = descent_step("classification", 2, alpha=0.1, dual_lr=0.5)
    masked = MaskedStep(descent, optimizer, ["hidden.weight"], sparsity=0.5)
    checks = MethodChecks(optimizer, masked, max_steps=40)
    assert [type(check) for check in checks.checks] == [MirrorCheck, DescentCheck, SparsityCheck]


def test_a_checks_state_written_before_the_registry_still_loads():
    # the flat dict MethodChecks wrote when it held every method's readings itself (8749abd)
    model = TinyClassifier()
    checks = MethodChecks(HORST(model.parameters(), lr=1e-3), max_steps=40)
    checks.load_state_dict({
        "warned": {"HORST:mirror_acts": {"step": 10, "check": "mirror_acts"}},
        "confirmed": {}, "ratios": [0.01, 0.02], "windows": [], "losses": [[1, 2.0]],
        "phases_read": 0, "largest_exponent": 0.0,
        "descent_counts": {"steps": 0, "active": 0, "late": 0, "met": 0},
        "largest_multiplier": 0.0, "multiplier_at_four_fifths": None, "multiplier_now": 0.0,
    })  # fmt: skip
    assert checks.checks[0].ratios == [0.01, 0.02]  # type: ignore[attr-defined]
    assert checks.losses == [(1, 2.0)] and list(checks.warned) == ["HORST:mirror_acts"]
    kept = {"warned", "confirmed", "losses", "ratios", "largest_exponent"}  # HORST's run only
    assert set(checks.state_dict()) == kept
