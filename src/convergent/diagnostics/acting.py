"""Whether a method acted: the thresholds of the manipulation checks, in one place.

Each method of this library acts only at a strength tied to the user's scale, and a run that
sits below it looks like any other run. These checks say so from numbers a run measures. The
studies import the same thresholds, so a study and a training run agree on what "acting"
means. Every function here is pure: it takes measured values and returns an `ActingCheck`,
whose `message` is the one warning line a run writes when the check fails.

| method | measured | acts when |
|---|---|---|
| HORST, HAM | mirror / base-step move ratio, mean over the readings | >= `MOVE_RATIO_FLOOR` |
| HAM | weights after its steps | all finite |
| Langevin | noise / gradient cumulative displacement over windows of the run's second half | >= `NOISE_DISPLACEMENT_FLOOR` |
| Langevin | train loss, latest against the first stretch | <= `FIT_KEPT_LOSS_MULTIPLE` |
| descent | largest lambda; share of steps with some lambda > 0 | >= `MULTIPLIER_FLOOR`; >= `ACTIVE_SHARE_FLOOR` |
| descent | share of steps after warm-up with every constraint met | >= `SATISFIED_SHARE_FLOOR` |
| descent | largest lambda, end against 4/5 of the run | <= `MULTIPLIER_GROWTH_LIMIT` |
| AC/DC, GMP | zeros among the prunable weights at a compressed phase's end | within `SPARSITY_TOLERANCE` |
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ACTIVE_SHARE_FLOOR",
    "FIT_KEPT_LOSS_MULTIPLE",
    "FIT_KEPT_RMSE_MULTIPLE",
    "MOVE_RATIO_FLOOR",
    "MULTIPLIER_FLOOR",
    "MULTIPLIER_GROWTH_LIMIT",
    "NOISE_DISPLACEMENT_FLOOR",
    "SATISFIED_SHARE_FLOOR",
    "SPARSITY_TOLERANCE",
    "WARMUP_FRACTION",
    "ActingCheck",
    "constraints_bind",
    "constraints_met",
    "fit_kept",
    "ham_finite",
    "mirror_acts",
    "multipliers_settled",
    "noise_acts",
    "sparsity_reached",
]

# Below a fifth, the mirror step moves the weights less than a fifth as far as the Adam (base)
# step does: HORST (HAM) is AdamW in all but name. The sparsity study's check.
MOVE_RATIO_FLOOR = 0.2
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
# AC/DC's global top-k lands within a percent of its target (the sparsity study's check).
SPARSITY_TOLERANCE = 0.01


@dataclass(frozen=True)
class ActingCheck:
    """One manipulation check on a run.

    Attributes:
        method: ``"HORST"``, ``"HAM"``, ``"Langevin"``, ``"descent"`` or ``"sparsity"``.
        name: a short key (``"mirror_acts"``, ``"noise_acts"``, ...).
        value: the measured value.
        threshold: what it is compared with.
        acted: whether the check passed.
        finding: what was measured, against what.
        advice: what it means when the check fails, and what to change.
    """

    method: str
    name: str
    value: float
    threshold: float
    acted: bool
    finding: str
    advice: str

    @property
    def message(self) -> str:
        """The warning line of a failed check: the finding, then the advice."""
        return f"{self.finding}: {self.advice}"

    @property
    def confirmation(self) -> str:
        """The line of a passed check."""
        return f"{self.method} acts: {self.finding}"

    def as_record(self) -> dict[str, object]:
        """A flat dict for logs and JSON (``check``, ``method``, ``value``, ...)."""
        return {
            "check": self.name,
            "method": self.method,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
        }


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


def sparsity_reached(achieved: float, target: float, step: int, method: str) -> ActingCheck:
    """The prunable weights were as sparse as the target, within `SPARSITY_TOLERANCE`.

    Args:
        achieved: the share of zeros among the prunable weights.
        target: the sparsity asked for.
        step: when it was measured, named in the message.
        method: ``"AC/DC"``, ``"GMP"`` or ``"fixed masks"``, named in the message.
    """
    gap = abs(achieved - target)
    return ActingCheck(
        "sparsity",
        "sparsity_reached",
        achieved,
        target,
        not gap > SPARSITY_TOLERANCE,
        f"{method} reached {100 * achieved:.1f} % sparsity at step {step} against a target of "
        f"{100 * target:.1f} % (within {100 * SPARSITY_TOLERANCE:g} points counts)",
        "the target was not reached; check that the schedule's total_steps is the run's "
        "length and that the masks are applied after every optimizer step.",
    )
