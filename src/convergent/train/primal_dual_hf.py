"""Descent constraints for users of ``transformers.Trainer``.

Swap ``Trainer`` for :class:`DescentTrainer` and pass a :class:`PrimalDualStep`::

    step = descent_step("classification", num_layers=6, alpha=0.05, dual_lr=0.5)
    trainer = DescentTrainer(model=model, args=args, train_dataset=train, descent=step)
    trainer.train()

``compute_loss`` returns the Lagrangian of the per-layer losses; after every optimizer step
a callback runs the dual update (on the step's cadence), and every training log carries the
objective, the per-layer losses, the slacks, lambda and u. The model's forward must accept
``output_hidden_states=True`` and return ``logits`` and ``hidden_states`` (our ``HFEncoder``
and ``Transformer``, or any ``*ForSequenceClassification`` model). The per-layer readout is,
in this order: the trainer's ``readout=``, the step's ``readout``, the model's own
``readout``, or else :func:`~convergent.losses.readout.sequence_classification_readout` of
the model, so a plain Hugging Face classification model needs nothing extra.

The dual state is saved as ``descent_state.pt`` in each ``checkpoint-*`` folder with a
``descent_state.pt.sha256`` checksum, verified when resuming.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, get_last_checkpoint

from convergent.losses.readout import sequence_classification_readout
from convergent.models import unwrap_model
from convergent.train.checkpoint import load_torch_with_checksum, save_torch_with_checksum
from convergent.train.checks_hf import TrainerChecks
from convergent.train.primal_dual import PrimalDualStep

STATE_FILE = "descent_state.pt"


class DescentCallback(TrainerCallback):
    """Runs the dual update after each optimizer step, saves the dual state with checkpoints,
    and runs the manipulation checks (do the constraints bind, are they met, have the
    multipliers settled; the optimizer's own): each failed check is one warning in the Python
    log and in ``log_history``."""

    def __init__(self, descent: PrimalDualStep) -> None:
        self.descent = descent
        self.latest: dict[str, float] = {}
        self.checks = TrainerChecks(descent)

    def on_train_begin(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, **_: Any
    ) -> None:
        self.checks.begin(state, optimizer)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if model is None:
            raise ValueError("the Trainer passed no model to on_step_end; cannot update lambda")
        metrics = self.descent.after_optimizer_step(model)
        self.latest.update(metrics)
        self.latest.update(self.checks.step(state, int(state.global_step), metrics, model))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        self.checks.log(state, logs)

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **_: Any
    ) -> None:
        self.checks.end(state, model)

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if folder.is_dir() and state.is_world_process_zero:
            save_torch_with_checksum(self.descent.state_dict(), folder / STATE_FILE)


class DescentTrainer(Trainer):
    """A ``transformers.Trainer`` that minimizes the descent-constrained Lagrangian.

    Args:
        *args: as for ``Trainer``.
        descent: the primal-dual step (constraints, multipliers, cadence).
        readout: the shared per-layer head ``readout(hidden_state, attention_mask)``; it
            becomes the step's readout. Without one (and without a step readout or a model
            ``readout``), :func:`sequence_classification_readout` of the model is used.
        **kwargs: as for ``Trainer``.

    Raises:
        ValueError: when no readout is given and the model has neither a ``readout`` nor a
            ``classifier`` to build one from.
    """

    loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides it for accumulation

    def __init__(
        self,
        *args: Any,
        descent: PrimalDualStep,
        readout: Callable[..., torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if "labels" not in self.label_names:
            # Our models' forward takes no labels; keep the column for the per-layer losses.
            self.label_names = [*self.label_names, "labels"]
        self.descent = descent
        if readout is not None:
            descent.readout = readout
        # The model the automatic readout was built for: rebuilt when model_init makes another.
        self._automatic_readout_model: nn.Module | None = None
        self._automatic_readout = descent.readout is None
        if self.model is not None:  # None with model_init: found at the first step instead
            self._find_readout(self.model)
        self.descent_callback = DescentCallback(descent)
        self.add_callback(self.descent_callback)

    def _find_readout(self, model: nn.Module) -> None:
        if not self._automatic_readout:
            return
        inner = unwrap_model(self.accelerator.unwrap_model(model))
        if inner is self._automatic_readout_model:
            return
        # A model with its own readout serves the step itself (the step's readout is None).
        own = callable(getattr(inner, "readout", None))
        self.descent.readout = None if own else sequence_classification_readout(inner)
        self._automatic_readout_model = inner

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        self._find_readout(self.model if self.model is not None else model)
        batch = {key: value for key, value in inputs.items() if isinstance(value, torch.Tensor)}
        value, metrics, output = self.descent.loss_and_output(model, batch)
        if model.training:
            self.descent_callback.latest.update(metrics)
        if return_outputs:
            return value, {"logits": output.logits}
        return value

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.descent_callback.latest:
            # The Trainer's "loss" is the Lagrangian it differentiated; add the parts.
            logs = {**logs, **self.descent_callback.latest}
        super().log(logs, start_time)

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """``Trainer.train``; resuming also restores lambda, u and the dual cadence.

        ``resume_from_checkpoint=True`` means the last ``checkpoint-*`` folder in
        ``args.output_dir``, as in ``Trainer``. A checkpoint without the dual state (one
        written by a plain ``Trainer``) raises, since resuming would silently reset lambda.
        """
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"resume_from_checkpoint=True, but {self.args.output_dir} holds no "
                    "checkpoint-* folder."
                )
        if isinstance(resume_from_checkpoint, str):
            self.load_descent_state(resume_from_checkpoint)
        return super().train(resume_from_checkpoint or None, trial, ignore_keys_for_eval)

    def load_descent_state(self, checkpoint: str | Path) -> None:
        """Restore lambda, u and the cadence state saved next to a Trainer checkpoint.

        Raises:
            FileNotFoundError: the checkpoint holds no descent state.
            CheckpointError: the descent state disagrees with its checksum or is not
                loadable with ``weights_only=True``.
        """
        path = Path(checkpoint) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist: {checkpoint} holds no descent state (was it written "
                "by DescentTrainer?)."
            )
        self.descent.load_state_dict(load_torch_with_checksum(path))
