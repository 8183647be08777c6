"""Gradual magnitude pruning's schedule (Zhu and Gupta, 2017, "To prune, or not to prune").

Masks are recomputed every ``frequency`` (dt) optimizer steps from ``start_step`` (t_0) to
``end_step`` (t_0 + n dt), each time at the sparsity

    s_t = s_f + (s_i - s_f) * (1 - (t - t_0) / (n dt))^3,

which prunes fast at first and slowly near the end; before t_0 the model is dense, from the end
on it stays at s_f. Between two updates the sparsity (and the mask) stays as the last update
set it. This module only says *when* and *how sparse*; the masks come from
:mod:`convergent.sparse.masks`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GradualSchedule"]

# A run's default GMP: dense for its first tenth, pruned gradually until three quarters in,
# then fine-tuned at the final sparsity (Zhu and Gupta prune over most of training and
# leave the tail for recovery), in at most this many mask updates.
RUN_START_FRACTION = 0.10
RUN_END_FRACTION = 0.75
RUN_UPDATES = 20


@dataclass(frozen=True)
class GradualSchedule:
    """The cubic sparsity schedule of gradual magnitude pruning, in optimizer steps.

    Attributes:
        final_sparsity: s_f, in [0, 1).
        start_step: t_0, the 0-based step index of the first pruning, >= 0.
        end_step: t_0 + n dt, the index of the last pruning (at s_f), > start_step.
        frequency: dt, steps between pruning updates, >= 1; it must divide
            end_step - start_step.
        initial_sparsity: s_i, the sparsity of the first pruning, in [0, final_sparsity].
    """

    final_sparsity: float
    start_step: int
    end_step: int
    frequency: int = 1
    initial_sparsity: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.final_sparsity < 1.0:
            raise ValueError(f"final_sparsity must be in [0, 1), got {self.final_sparsity}")
        if not 0.0 <= self.initial_sparsity <= self.final_sparsity:
            raise ValueError(
                f"initial_sparsity must be in [0, final_sparsity = {self.final_sparsity}], "
                f"got {self.initial_sparsity}"
            )
        for name in ("start_step", "end_step", "frequency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {self.start_step}")
        if self.end_step <= self.start_step:
            raise ValueError(
                f"end_step must be > start_step = {self.start_step}, got {self.end_step}"
            )
        if self.frequency < 1 or (self.end_step - self.start_step) % self.frequency:
            raise ValueError(
                f"frequency must be an integer >= 1 that divides end_step - start_step = "
                f"{self.end_step - self.start_step}, got {self.frequency}"
            )

    @classmethod
    def over_run(cls, total_steps: int, final_sparsity: float) -> GradualSchedule:
        """The default GMP of a run of ``total_steps``: pruning from 10 % of the run to 75 %,
        in at most 20 updates, at equal intervals (the end moves back to a whole number of
        intervals)."""
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 2:
            raise ValueError(
                f"gradual pruning needs a run of at least 2 steps, got total_steps={total_steps!r}"
            )
        start = int(RUN_START_FRACTION * total_steps)
        span = max(int(RUN_END_FRACTION * total_steps) - start, 1)
        frequency = max(-(-span // RUN_UPDATES), 1)  # rounded up: at most RUN_UPDATES
        end = start + (span // frequency) * frequency
        return cls(final_sparsity, start_step=start, end_step=end, frequency=frequency)

    @property
    def updates(self) -> int:
        """n, the number of intervals; the masks are recomputed n + 1 times."""
        return (self.end_step - self.start_step) // self.frequency

    def is_update(self, step_index: int) -> bool:
        """Whether the masks are recomputed before the step with 0-based index ``step_index``."""
        offset = step_index - self.start_step
        return 0 <= offset <= self.end_step - self.start_step and offset % self.frequency == 0

    def sparsity_at(self, step_index: int) -> float:
        """The sparsity the step with 0-based index ``step_index`` trains at (0 before t_0)."""
        if step_index < 0:
            raise ValueError(f"step_index must be >= 0, got {step_index}")
        if step_index < self.start_step:
            return 0.0
        done = min((step_index - self.start_step) // self.frequency, self.updates)
        remaining = 1.0 - done / self.updates
        return self.final_sparsity + (self.initial_sparsity - self.final_sparsity) * remaining**3
