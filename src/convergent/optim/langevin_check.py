"""Langevin's acting check: does the noise move the weights, and is the fit kept?

    update rule checked: T <- T - lr * G grad V~(T) + sqrt(lr * s * G) * xi  (G = 1 without
    a preconditioner)

Over a window of `WINDOW_STEPS` steps before each reading, the noise's expected cumulative
displacement sqrt(sum lr s sum G) is set against the gradient steps' ||sum lr G grad||; the
check decides at the end, on the windows of the run's second half, against
`NOISE_DISPLACEMENT_FLOOR`. The train loss must stay within `FIT_KEPT_LOSS_MULTIPLE` of its
first stretch. Before the first step, the run's largest s is stated in loss units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from convergent.acting import ActingCheck, RunShape, register_check
from convergent.optim import _sharding
from convergent.optim.langevin import Langevin
from convergent.optim.temperature import describe_temperature

__all__ = [
    "FIT_KEPT_LOSS_MULTIPLE",
    "FIT_KEPT_RMSE_MULTIPLE",
    "NOISE_DISPLACEMENT_FLOOR",
    "WINDOW_STEPS",
    "LangevinCheck",
    "fit_kept",
    "noise_acts",
]

# The langevin study's fit-kept check: train RMSE at most 1.25x its start, i.e. a squared
# loss at most 1.25^2 = 1.5625x (applied to the run's own loss, whatever it is).
FIT_KEPT_RMSE_MULTIPLE = 1.25
FIT_KEPT_LOSS_MULTIPLE = FIT_KEPT_RMSE_MULTIPLE**2
# Over a window of steps, the injected noise moves the weights as a random walk, about
# sqrt(sum lr * s) per coordinate, while the gradient's moves add up: coherently where the
# loss still falls, as a walk of their own where minibatch noise dominates. Below a half, the
# noise's displacement is under a fifth of the gradient's in squared norm: the chain follows
# its gradient, and the noise is a small perturbation of gradient descent.
NOISE_DISPLACEMENT_FLOOR = 0.5
# The window: long enough for a drift to add up, short next to a run.
WINDOW_STEPS = 20


def noise_acts(noise: float, gradient: float, s: float) -> ActingCheck:
    """The injected noise's cumulative displacement over a window is at least
    `NOISE_DISPLACEMENT_FLOOR` times the gradient's.

    Args:
        noise: the noise's expected displacement over the window, sqrt(sum_t lr_t s_t
            sum_i G_i) (G the preconditioner, 1 without one).
        gradient: the norm of the gradient steps' sum over the same window,
            ||sum_t lr_t G grad_t||.
        s: the temperature, named in the message.
    """
    value = noise / gradient if gradient > 0 else (math.inf if noise > 0 else math.nan)
    acted = not value < NOISE_DISPLACEMENT_FLOOR
    return ActingCheck(
        "Langevin",
        "noise_acts",
        value,
        NOISE_DISPLACEMENT_FLOOR,
        acted,
        f"Langevin's noise moved the weights {value:.2g}x as far as its gradient steps over "
        f"its windows (it acts from {NOISE_DISPLACEMENT_FLOOR:g}x)",
        f"it is acting as gradient descent; raise the temperature (now s = {s:.3g}).",
    )


def fit_kept(start_loss: float, loss: float, s: float) -> ActingCheck:
    """The train loss stayed within `FIT_KEPT_LOSS_MULTIPLE` of its value at the start.

    Args:
        start_loss: the mean train loss over the run's first stretch.
        loss: the mean train loss over its latest stretch.
        s: the temperature, named in the message.
    """
    value = loss / start_loss if start_loss > 0 else math.nan
    acted = not value > FIT_KEPT_LOSS_MULTIPLE
    return ActingCheck(
        "Langevin",
        "fit_kept",
        value,
        FIT_KEPT_LOSS_MULTIPLE,
        acted,
        f"Langevin's train loss went to {value:.3g}x its start ({start_loss:.4g} -> "
        f"{loss:.4g}; at most {FIT_KEPT_LOSS_MULTIPLE:g}x keeps the fit)",
        f"the fit is lost, the noise is too hot; lower the temperature (now s = {s:.3g}).",
    )


class LangevinCheck:
    """The acting check of a `Langevin` optimizer (a `convergent.acting.MethodCheck`).

    Args:
        optimizer: the run's Langevin.
        run: the run's length and reading interval.
    """

    proofs = ("noise_acts",)

    def __init__(self, optimizer: Langevin, run: RunShape) -> None:
        self.optimizer = optimizer
        self.every = run.every
        self.windows: list[tuple[float, float]] = []  # (noise^2, gradient^2) per window
        self._drift: dict[int, Tensor] = {}
        self._noise_squared = 0.0

    def s(self) -> float:
        """The run's largest temperature."""
        return max(float(group["s"]) for group in self.optimizer.param_groups)

    def introduce(self, train_data: Any, task: str) -> str | None:
        """The largest s in loss units (N the training examples, K a label's numbers)."""
        examples = len(train_data)
        outputs = 1
        if task == "regression" and examples:
            outputs = max(1, int(torch.as_tensor(train_data[0]["labels"]).numel()))
        return describe_temperature(self.s(), max(1, examples), outputs)

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[ActingCheck]:
        """Adds step ``step``'s gradient move and noise variance to the window of the last
        `WINDOW_STEPS` steps before each reading; the reading's step closes it."""
        window = min(WINDOW_STEPS, self.every)
        if (step - 1) % self.every == self.every - window:  # the window's first step
            self._drift, self._noise_squared = {}, 0.0
        elif not (step % self.every == 0 or step % self.every > self.every - window):
            return []
        for group in self.optimizer.param_groups:
            lr, s, eps = float(group["lr"]), float(group["s"]), float(group["eps"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = _sharding.local(param.grad).detach().double()
                state = self.optimizer.state.get(param, {})
                if group["preconditioned"] and "square_avg" in state:
                    # G = 1 / D with the denominator the step just used (v after its update)
                    inverse = 1.0 / (_sharding.local(state["square_avg"]).double().sqrt() + eps)
                    move = lr * inverse * grad
                    self._noise_squared += lr * s * float(inverse.sum())
                else:
                    move = lr * grad
                    self._noise_squared += lr * s * grad.numel()
                key = id(param)
                self._drift[key] = self._drift[key] + move if key in self._drift else move
        if step % self.every == 0:
            gradient = sum(float(move.square().sum()) for move in self._drift.values())
            self.windows.append((self._noise_squared, gradient))
            self._drift, self._noise_squared = {}, 0.0
        return []

    def read(self, step: int) -> tuple[dict[str, float], list[ActingCheck]]:
        if not self.windows:
            return {}, []
        noise, gradient = self.windows[-1]
        ratio = math.sqrt(noise / gradient) if gradient > 0 else math.inf
        return {"noise_displacement_ratio": ratio}, []

    def decide(
        self,
        step: int,
        losses: Sequence[tuple[int, float]],
        final: bool,
        model: nn.Module | None,
    ) -> list[ActingCheck]:
        checks = []
        s = self.s()
        # The noise check decides at the end, on the windows of the run's second half:
        # while the loss still falls, the gradient's drift outruns any useful noise.
        late = self.windows[len(self.windows) // 2 :]
        if final and late:
            noise = math.sqrt(sum(noise for noise, _ in late))
            gradient = math.sqrt(sum(gradient for _, gradient in late))
            checks.append(noise_acts(noise, gradient, s))
        stretch = max(1, self.every)
        if len(losses) >= 2 * stretch:
            start = sum(loss for _, loss in losses[:stretch]) / stretch
            latest = sum(loss for _, loss in losses[-stretch:]) / stretch
            checks.append(fit_kept(start, latest, s))
        return checks

    def state_dict(self) -> dict[str, Any]:
        """The windows read so far; the open window is not kept (it restarts)."""
        return {"windows": [list(window) for window in self.windows]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.windows = [(float(a), float(b)) for a, b in state["windows"]]


register_check(Langevin, lambda optimizer, run: [LangevinCheck(optimizer, run)])
