"""Metrics to JSON lines and TensorBoard, written by the main process only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .distributed import is_main_process


class MetricsLogger:
    """Append metrics to ``metrics.jsonl`` and, if available, a TensorBoard event file.

    Each record is one JSON object: ``{"step": 10, "split": "train", "loss": 0.7, ...}``.

    Args:
        run_dir: the run folder; ``None`` keeps records in memory only.
        tensorboard: also write TensorBoard scalars under ``run_dir/tensorboard``.
    """

    def __init__(self, run_dir: str | Path | None, tensorboard: bool = True) -> None:
        self.records: list[dict[str, Any]] = []
        self._file = None
        self._writer = None
        if run_dir is None or not is_main_process():
            return
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self._file = open(folder / "metrics.jsonl", "a")  # noqa: SIM115 - closed in close()
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

    def close(self) -> None:
        """Flush and close the files."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


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
