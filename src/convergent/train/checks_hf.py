"""The manipulation checks of :mod:`convergent.train.checks` inside ``transformers.Trainer``.

With HORST, HAM or Langevin as a plain Trainer optimizer, add one callback::

    trainer = Trainer(model=model, args=args, train_dataset=train,
                      optimizers=(HORST(model.parameters(), lr=5e-5), None),
                      callbacks=[MethodChecksCallback()])

It reads the optimizer every 1/20 of the run (right after ``optimizer.step()``, while the
gradients are still there) and the train loss from the Trainer's logs. Each failed check is
one warning in the Python log and one entry in ``trainer.state.log_history``
(``{"step", "warning", "check", "method", "value", "threshold"}``). `SparsityCallback` and
`DescentTrainer` run the same checks themselves (with their masks' and constraints' checks):
do not add this callback beside them.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.optim import Optimizer
from transformers import TrainerCallback

from convergent.diagnostics.acting import ActingCheck
from convergent.train.checks import MethodChecks, log_failures

__all__ = ["MethodChecksCallback", "TrainerChecks", "add_to_log"]


def _inner_optimizer(optimizer: Any) -> Optimizer:
    """The optimizer behind accelerate's wrapper (the Trainer passes the wrapper)."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, Optimizer) else optimizer


def add_to_log(state: Any, logs: dict[str, Any] | None, values: dict[str, float]) -> None:
    """Adds ``values`` to a training log (one with a loss) in ``on_log``, and to the copy the
    Trainer has already put in ``log_history``."""
    if logs is None or not values or "loss" not in logs:
        return
    logs.update(values)
    history = state.log_history
    if history and history[-1].get("step") == state.global_step and "loss" in history[-1]:
        history[-1].update(values)


class TrainerChecks:
    """`MethodChecks` driven by Trainer events, reporting into the Trainer's state.

    Args:
        training_step: a training step whose registered checks to add (a `MaskedStep`'s, a
            `PrimalDualStep`'s), or None.
        every: steps between readings; None: 20 readings per run.
    """

    def __init__(self, training_step: Any = None, every: int | None = None) -> None:
        self.training_step = training_step
        self.every = every
        self.checks: MethodChecks | None = None

    def begin(self, state: Any, optimizer: Any) -> None:
        """At ``on_train_begin``: the run's optimizer and length."""
        if optimizer is None:
            raise ValueError("the Trainer passed no optimizer to on_train_begin; checks need one")
        self.checks = MethodChecks(
            _inner_optimizer(optimizer),
            self.training_step,
            max_steps=max(1, int(state.max_steps)),
            every=self.every,
        )

    def step(
        self, state: Any, step: int, metrics: dict[str, float], model: nn.Module | None
    ) -> dict[str, float]:
        """After optimizer step ``step``: reads the run; returns this step's readings."""
        if self.checks is None:
            return {}
        readings, failed = self.checks.after_step(step, metrics, model)
        self._report(state, step, failed)
        return readings

    def log(self, state: Any, logs: dict[str, Any] | None) -> None:
        """At ``on_log``: the train loss for the Langevin fit check."""
        if self.checks is not None and logs and "loss" in logs:
            self.checks.record_loss(int(state.global_step), float(logs["loss"]))

    def end(self, state: Any, model: nn.Module | None) -> None:
        """At ``on_train_end``: every check decides."""
        if self.checks is not None:
            step = int(state.global_step)
            self._report(state, step, self.checks.finish(step, model))

    @staticmethod
    def _report(state: Any, step: int, failed: list[ActingCheck]) -> None:
        log_failures(failed)
        for check in failed:
            record = check.as_record()
            state.log_history.append({"step": step, "warning": record.pop("message"), **record})


class MethodChecksCallback(TrainerCallback):
    """Warns once per failed manipulation check of a Trainer run's optimizer (HORST, HAM,
    Langevin, or any optimizer whose check is registered with `convergent.acting`); its
    readings (``mirror_move_ratio``, ``noise_displacement_ratio``) join the next training log.

    Args:
        every: optimizer steps between readings; None: 20 readings per run.
    """

    def __init__(self, every: int | None = None) -> None:
        self.checks = TrainerChecks(None, every)
        self.latest: dict[str, float] = {}

    def on_train_begin(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, **_: Any
    ) -> None:
        self.checks.begin(state, optimizer)

    def on_optimizer_step(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **_: Any
    ) -> None:
        # global_step counts this step only after the callback
        self.latest.update(self.checks.step(state, int(state.global_step) + 1, {}, model))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        self.checks.log(state, logs)
        add_to_log(state, logs, self.latest)

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **_: Any
    ) -> None:
        self.checks.end(state, model)
