"""Langevin's temperature s in the units a user reads, and a schedule for it.

`convergent.optim.Langevin` steps T <- T - lr * grad V(T) + sqrt(lr * s) * xi, whose chain
samples the density proportional to exp(-2 V / s). These helpers translate s to and from
other conventions and to a loss's Bayesian posterior; `NoiseSchedule` moves s over training.

Temperature in other libraries. posteriors (`posteriors.sgmcmc.sgld`, normal-computing/
posteriors) and blackjax (`blackjax.sgmcmc.diffusions.overdamped_langevin`) both step
theta + lr * grad log p + sqrt(2 * temperature * lr) * xi (posteriors writes the noise as
N(0, lr * (2 - lr * beta) * temperature), which is the same at its default beta = 0) and target
p^(1 / temperature). With V = -log p the two rules agree when

    s = 2 * temperature        (temperature = s / 2),

so s = 2 is their temperature 1 (the Bayesian posterior when V is the negative log posterior)
and s = 0 is their temperature 0 (gradient descent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer

from convergent.optim._validation import check_nonnegative

__all__ = [
    "NoiseSchedule",
    "calibrated_s",
    "describe_temperature",
    "implied_noise_variance",
    "posterior_s",
    "s_from_temperature",
    "temperature_from_s",
]


def s_from_temperature(temperature: float) -> float:
    """The s of this optimizer for a posteriors/blackjax `temperature`: s = 2 * temperature."""
    check_nonnegative("temperature", temperature)
    return 2.0 * float(temperature)


def temperature_from_s(s: float) -> float:
    """The posteriors/blackjax temperature of this optimizer's s: temperature = s / 2."""
    check_nonnegative("s", s)
    return float(s) / 2.0


def calibrated_s(noise_variance: float, examples: int, outputs: int = 1) -> float:
    """The s that makes Langevin on an averaged squared error sample the Bayesian posterior.

    The stationary density of dT = -grad V dt + sqrt(s) dB is proportional to exp(-2 V / s).
    For V = the squared error averaged over ``examples`` x ``outputs`` numbers, a Gaussian
    likelihood with noise variance sigma^2 and a flat prior give the posterior
    exp(-examples * outputs * V / (2 sigma^2)); the two agree at
    s = 4 sigma^2 / (examples * outputs). A natural sigma^2 is the fitted model's mean squared
    error. s = 2 / examples (the posterior for the summed loss, as if sigma^2 were
    outputs / 2) is hotter by outputs / (2 sigma^2).

    Args:
        noise_variance: sigma^2, in the units of the loss (> 0).
        examples: N, the training examples the loss averages over.
        outputs: K, the numbers per example it also averages over.
    """
    if not (noise_variance > 0 and examples >= 1 and outputs >= 1):
        raise ValueError(
            "noise_variance must be > 0 and examples, outputs >= 1, got "
            f"noise_variance={noise_variance!r}, examples={examples!r}, outputs={outputs!r}."
        )
    return 4.0 * float(noise_variance) / (examples * outputs)


def implied_noise_variance(s: float, examples: int, outputs: int = 1) -> float:
    """The inverse of `calibrated_s`: the sigma^2, in loss units, whose posterior s samples."""
    check_nonnegative("s", s)
    if not (examples >= 1 and outputs >= 1):
        raise ValueError(
            f"examples and outputs must be >= 1, got examples={examples!r}, outputs={outputs!r}."
        )
    return float(s) * examples * outputs / 4.0


def posterior_s(examples: int, outputs: int = 1, noise_variance: float | None = None) -> float:
    """The s whose Langevin chain samples the Bayesian posterior of a model trained on an
    averaged loss: the temperature in loss units.

    - An averaged squared error over ``examples`` x ``outputs`` numbers with noise variance
      ``noise_variance`` = sigma^2 (a Gaussian likelihood; flat prior): s = 4 sigma^2 / (N K),
      as `calibrated_s`. "The current loss as sigma^2" is ``noise_variance=`` the current mean
      squared error (a fitted model's).
    - An averaged negative log-likelihood (cross-entropy; ``noise_variance`` None): the loss
      is the summed log-likelihood over N, so the posterior is s = 2 / N.

    How to read it: these are the posteriors of the whole training set, and the langevin study
    found them extreme for a small model both ways. At s = 2 / N (every example one
    observation) a small regression Transformer lost its fit (train RMSE 8.6-9.4x) while being
    about 19,000x hotter than the calibrated 4 sigma^2 / (N K); at the calibrated s the noise
    moved the outcome by 0.1 %. `convergent.train.fit` checks both: whether the noise moves the
    weights as far as the gradient does (`diagnostics.acting.noise_acts`) and whether the
    fit is kept (`fit_kept`). Scale s between them (a temperature below 1 of the posterior)
    until the noise acts and the fit holds.

    Args:
        examples: N, the training examples the loss averages over.
        outputs: K, the numbers per example it also averages over (squared error only).
        noise_variance: sigma^2 in the loss's units, > 0; None for a cross-entropy loss.
    """
    if noise_variance is None:
        if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
            raise ValueError(f"examples must be an integer >= 1, got {examples!r}.")
        return 2.0 / examples
    return calibrated_s(noise_variance, examples, outputs)


def describe_temperature(s: float, examples: int, outputs: int = 1) -> str:
    """One line giving s in the units a user can read: against the cross-entropy posterior
    2 / N, as the noise variance sigma^2 (loss units) of a squared-loss posterior, and as the
    posteriors/blackjax temperature s / 2."""
    check_nonnegative("s", s)
    cross_entropy = posterior_s(examples)
    return (
        f"Langevin s = {s:.3g}: {s / cross_entropy:.3g}x the cross-entropy posterior "
        f"2/N = {cross_entropy:.3g} (N = {examples}); the posterior of an averaged squared "
        f"error with noise variance sigma^2 = {implied_noise_variance(s, examples, outputs):.3g}"
        f" (K = {outputs}); temperature {temperature_from_s(s):.3g} in posteriors/blackjax"
    )


class NoiseSchedule:
    """Sets each group's s to its initial s times `factor(step)`, like `LambdaLR` for s.

    Call `step()` after each optimizer step (or pass it to `convergent.train.fit` as a
    callback: `on_step_end` calls `step()`). s depends only on the step count, so a resumed
    run continues the same schedule.

    Args:
        optimizer: a `Langevin` optimizer (any optimizer whose groups have "s").
        factor: step -> multiplier of the initial s, e.g. `lambda step: 0.99 ** step`.
    """

    def __init__(self, optimizer: Optimizer, factor: Callable[[int], float]) -> None:
        for index, group in enumerate(optimizer.param_groups):
            if "s" not in group:
                raise ValueError(f"param group {index} has no 's'; NoiseSchedule needs Langevin.")
        self.optimizer = optimizer
        self.factor = factor
        self.initial_s = [float(group["s"]) for group in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def _apply(self) -> None:
        multiplier = float(self.factor(self.last_step))
        check_nonnegative(f"factor({self.last_step})", multiplier)
        for group, initial in zip(self.optimizer.param_groups, self.initial_s, strict=True):
            group["s"] = initial * multiplier

    def step(self) -> None:
        """Advance one step and set the groups' s."""
        self.last_step += 1
        self._apply()

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        """`fit` callback: sets s for the step after `step`."""
        self.last_step = step
        self._apply()

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "initial_s": list(self.initial_s)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self.initial_s = [float(value) for value in state["initial_s"]]
        self._apply()
