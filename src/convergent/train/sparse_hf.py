"""Sparse training for users of ``transformers.Trainer``: one callback.

Add :class:`SparsityCallback` to a plain ``Trainer`` (any optimizer, HORST included)::

    trainer = Trainer(
        model=model, args=args, train_dataset=train,
        optimizers=(HORST(model.parameters(), lr=3e-5, alpha=100.0), None),
        callbacks=[SparsityCallback(sparsity=0.8)],   # AC/DC to 80 % over the run
    )
    trainer.train()

The callback drives :class:`~convergent.train.masked.MaskedStep`, the same masks and phase
logic as ``convergent train --sparsity``: prunable weights chosen by a
:class:`~convergent.sparse.MaskSpec` (linear layers and GPT-2 ``Conv1D``; embeddings,
the first and the last layer excluded by default; a tied weight counted once), magnitude
masks at every compression, the masks re-applied right after every optimizer step of a
compressed phase, and the optimizer's moments of pruned weights reset at every phase flip.
Under DDP the masks of rank 0 are broadcast, so every rank holds the same masks.

Schedules: ``"acdc"`` (:class:`~convergent.sparse.ACDCSchedule` over the run's
``max_steps``; its defaults are the paper's recipe), ``"gmp"`` (gradual magnitude pruning
over the run, :meth:`~convergent.sparse.GradualSchedule.over_run`), ``"fixed"`` (compressed from the first
step to the last), an ``ACDCSchedule`` of your own, or a
:class:`~convergent.sparse.GradualSchedule` (gradual magnitude pruning; its final sparsity
must be the callback's).

The masks and the schedule's position are saved as ``sparsity_state.pt`` (with a
``.sha256`` checksum) in every ``checkpoint-*`` folder and restored when the Trainer resumes
from it, so a resumed run continues bit for bit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from convergent.models import unwrap_model
from convergent.sparse import ACDCSchedule, GradualSchedule, MaskSpec, layer_sparsity
from convergent.sparse.masks import check_sparsity
from convergent.train.checkpoint import load_torch_with_checksum, save_torch_with_checksum
from convergent.train.checks_hf import TrainerChecks, add_to_log
from convergent.train.masked import MaskedStep

logger = logging.getLogger(__name__)

STATE_FILE = "sparsity_state.pt"
SCHEDULES = ("acdc", "gmp", "fixed")


class SparsityCallback(TrainerCallback):
    """AC/DC, gradual (GMP) or fixed-mask sparse training inside ``transformers.Trainer``.

    Args:
        sparsity: the target sparsity of every compression, in [0, 1).
        schedule: ``"acdc"`` (default), ``"gmp"`` (``GradualSchedule.over_run`` of the run's
            ``max_steps``), ``"fixed"``, an :class:`ACDCSchedule` (its ``total_steps`` should
            be the run's ``max_steps``) or a :class:`~convergent.sparse.GradualSchedule`.
        spec: which weights are pruned, the masks' distribution and pattern; None is
            ``MaskSpec()``.
        reset: optimizer state reset at phase flips: ``"none"``, ``"momentum"`` (default)
            or ``"moments"``.
        reset_how: ``"mask"`` (zero the pruned entries, default) or ``"zero"``.
        resume_from: the checkpoint folder to read the sparsity state from when the Trainer
            resumes; None looks in ``output_dir/checkpoint-<global step>``.

    Attributes:
        masked: the :class:`MaskedStep` of the current run (set when training begins).
        names: the prunable parameter names.
        latest: the last step's ``sparsity`` and ``compressed``, added to every log.
        layer_reports: (step, per-matrix sparsity rows) at every phase change and mask
            update, also logged as a table (INFO).
        checks: the run's manipulation checks (`convergent.train.checks_hf.TrainerChecks`):
            the sparsity reached at the end of every compressed phase and of the run, and
            the optimizer's own (HORST's and HAM's mirror step). A failed check is one
            warning in the Python log and in ``log_history``.
    """

    def __init__(
        self,
        sparsity: float,
        *,
        schedule: str | ACDCSchedule | GradualSchedule = "acdc",
        spec: MaskSpec | None = None,
        reset: str = "momentum",
        reset_how: str = "mask",
        resume_from: str | Path | None = None,
    ) -> None:
        check_sparsity(sparsity)
        if not isinstance(schedule, ACDCSchedule | GradualSchedule) and schedule not in SCHEDULES:
            raise ValueError(
                f"schedule={schedule!r} is not supported; allowed are {', '.join(SCHEDULES)}, "
                "an ACDCSchedule or a GradualSchedule."
            )
        self.sparsity = sparsity
        self.schedule = schedule
        self.spec = MaskSpec.given(spec)
        self.reset = reset
        self.reset_how = reset_how
        self.resume_from = resume_from
        self.masked: MaskedStep | None = None
        self.names: list[str] = []
        self.latest: dict[str, float] = {}
        self.layer_reports: list[tuple[int, list[dict[str, Any]]]] = []
        self.checks = TrainerChecks()

    def _schedule_for(self, max_steps: int) -> ACDCSchedule | GradualSchedule | None:
        if isinstance(self.schedule, ACDCSchedule | GradualSchedule):
            return self.schedule
        if self.schedule == "gmp":
            return GradualSchedule.over_run(max_steps, self.sparsity)
        return ACDCSchedule(max_steps) if self.schedule == "acdc" else None

    def _state_path(self, args: Any, state: Any) -> Path:
        folder = (
            Path(self.resume_from)
            if self.resume_from is not None
            else Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        )
        return folder / STATE_FILE

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: nn.Module | None = None,
        optimizer: Any = None,
        **_: Any,
    ) -> None:
        if model is None or optimizer is None:
            raise ValueError(
                "the Trainer passed no model or optimizer to on_train_begin; SparsityCallback "
                "needs both"
            )
        inner = unwrap_model(model)
        selection = self.spec.select(inner)
        self.names = selection.names
        self.masked = MaskedStep(
            None,
            optimizer,
            selection.names,
            sparsity=self.sparsity,
            schedule=self._schedule_for(int(state.max_steps)),
            spec=self.spec,
            input_dims=selection.input_dims,
            reset=self.reset,
            reset_how=self.reset_how,
        )
        if state.global_step > 0:
            path = self._state_path(args, state)
            if not path.is_file():
                raise FileNotFoundError(
                    f"the Trainer resumes at step {state.global_step} but {path} does not "
                    "exist; pass SparsityCallback(resume_from=<the checkpoint folder>) so the "
                    "masks and schedule are restored instead of silently reset."
                )
            self.masked.load_state_dict(load_torch_with_checksum(path))
        else:
            self.masked.start(inner)
        self.checks = TrainerChecks(self.masked)
        self.checks.begin(state, optimizer)

    def on_optimizer_step(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **_: Any
    ) -> None:
        if self.masked is None or model is None:
            raise ValueError("SparsityCallback saw an optimizer step before training began")
        # Right after optimizer.step(): re-mask, count the step, flip phase if one ends here.
        compressions, compressed = self.masked.compressions, self.masked.masks is not None
        self.latest = self.masked.after_optimizer_step(model)
        if (self.masked.compressions, self.masked.masks is not None) != (compressions, compressed):
            self._report_layers(int(state.global_step) + 1, model)
        # global_step counts this step only after the callback
        self.latest.update(self.checks.step(state, int(state.global_step) + 1, self.latest, model))

    def _report_layers(self, step: int, model: nn.Module) -> None:
        rows = layer_sparsity(unwrap_model(model), self.names)
        self.layer_reports.append((step, rows))
        phase = "compressed" if self.latest.get("compressed") else "dense"
        table = "\n".join(
            f"  {row['name']}  {'x'.join(map(str, row['shape']))}  {row['sparsity']:.4f}"
            for row in rows
        )
        logger.info("sparsity per matrix after step %d (%s):\n%s", step, phase, table)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        self.checks.log(state, logs)
        add_to_log(state, logs, self.latest)

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **_: Any
    ) -> None:
        self.checks.end(state, model)

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self.masked is not None and folder.is_dir() and state.is_world_process_zero:
            save_torch_with_checksum(self.masked.state_dict(), folder / STATE_FILE)
