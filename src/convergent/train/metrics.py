"""Metrics to JSON lines and TensorBoard, written by the main process only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from convergent.io import write_text_atomically
from convergent.train.distributed import is_main_process


class MetricsLogger:
    """Append metrics to ``metrics.jsonl`` and, if available, a TensorBoard event file.

    Each record is one JSON object: ``{"step": 10, "split": "train", "loss": 0.7, ...}``.

    Args:
        run_dir: the run folder; ``None`` keeps records in memory only.
        tensorboard: also write TensorBoard scalars under ``run_dir/tensorboard``.
        resume_step: on resume, the checkpoint's step: records of later steps (written by the
            interrupted run after its last checkpoint, and about to be redone) are dropped, so
            the file holds each step once. None (a new run) starts an empty file.
    """

    def __init__(
        self, run_dir: str | Path | None, tensorboard: bool = True, resume_step: int | None = None
    ) -> None:
        self.records: list[dict[str, Any]] = []
        self._file = None
        self._writer = None
        if run_dir is None or not is_main_process():
            return
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "metrics.jsonl"
        kept = [] if resume_step is None else _records_up_to(path, resume_step)
        write_text_atomically(path, "".join(json.dumps(record) + "\n" for record in kept))
        self._file = open(path, "a")  # noqa: SIM115 - closed in close()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional at run time
                return
            self._writer = SummaryWriter(log_dir=str(folder / "tensorboard"))

    def log(self, step: int, split: str, values: dict[str, float]) -> None:
        """Record ``values`` for ``split`` at ``step``."""
        record: dict[str, Any] = {"step": step, "split": split}
        record.update({key: _plain(value) for key, value in values.items()})
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._writer is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    self._writer.add_scalar(f"{split}/{key}", value, step)

    def warn(self, step: int, record: dict[str, Any]) -> None:
        """Record a failed manipulation check (`convergent.train.checks`): a ``"warning"``
        line in ``metrics.jsonl`` and a TensorBoard text under ``warnings/<check>`` (not in
        ``records``: `fit` returns them in ``FitResult.warnings``)."""
        entry: dict[str, Any] = {"step": step, "split": "warning"}
        entry.update({key: _plain(value) for key, value in record.items()})
        if self._file is not None:
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()
        if self._writer is not None:
            self._writer.add_text(f"warnings/{record['check']}", str(record["message"]), step)

    def close(self) -> None:
        """Flush and close the files."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _records_up_to(path: Path, step: int) -> list[dict[str, Any]]:
    """The records of ``path`` up to ``step``; a line torn by a crash is dropped."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and int(record.get("step", 0)) <= step:
            kept.append(record)
    return kept


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file (or the one inside a run folder)."""
    file = Path(path)
    if file.is_dir():
        file = file / "metrics.jsonl"
    with open(file) as handle:
        return [json.loads(line) for line in handle if line.strip()]
