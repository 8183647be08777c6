"""AC/DC: alternating compressed and decompressed training (Peste et al., 2021), in steps.

The schedule over ``total_steps`` optimizer steps (defaults: the paper's ImageNet recipe):

    dense warm-up (10 %) | C | D | C | D | ... | C | last dense (10 %) | final compressed (15 %)

with compressed (C) and decompressed (D) phases of 5 % each in the middle, starting with C.
Each compression goes straight to the target sparsity, with masks from the current weights
(global magnitude by default); during a C phase the masks are re-applied after every step; a
D phase trains every weight again, starting from zero for the pruned ones. Steps that do not
divide evenly go to the last dense phase.

This module only says *when*; the masks come from :mod:`convergent.sparse.masks`, and the
glue that applies them during training is :class:`convergent.train.masked.MaskedStep`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Phase:
    """Steps ``start <= i < stop`` (0-based optimizer step indices), compressed or dense."""

    start: int
    stop: int
    compressed: bool

    @property
    def length(self) -> int:
        """Steps in the phase."""
        return self.stop - self.start


@dataclass(frozen=True)
class ACDCSchedule:
    """When AC/DC trains sparse and when dense.

    Attributes:
        total_steps: optimizer steps in all.
        warmup_fraction: the dense warm-up, as a fraction of ``total_steps``.
        phase_fraction: the length of each alternating phase.
        final_dense_fraction: the last dense phase.
        final_compressed_fraction: the final compressed fine-tune.
    """

    total_steps: int
    warmup_fraction: float = 0.10
    phase_fraction: float = 0.05
    final_dense_fraction: float = 0.10
    final_compressed_fraction: float = 0.15

    def __post_init__(self) -> None:
        if isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int):
            raise ValueError(f"total_steps must be an integer >= 1, got {self.total_steps!r}")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be an integer >= 1, got {self.total_steps}")
        for name in ("warmup_fraction", "final_dense_fraction", "final_compressed_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if not 0.0 < self.phase_fraction <= 1.0:
            raise ValueError(f"phase_fraction must be in (0, 1], got {self.phase_fraction}")
        fixed = self.warmup_fraction + self.final_dense_fraction + self.final_compressed_fraction
        if fixed > 1.0 + 1e-12:
            raise ValueError(
                "warmup_fraction + final_dense_fraction + final_compressed_fraction must be at"
                f" most 1, got {fixed:g}"
            )

    @cached_property
    def phases(self) -> tuple[Phase, ...]:
        """The phases in order; adjacent phases of the same kind are merged."""
        total = self.total_steps
        warmup = round(self.warmup_fraction * total)
        final_compressed = round(self.final_compressed_fraction * total)
        if self.final_compressed_fraction > 0:
            final_compressed = max(final_compressed, 1)
        final_dense = round(self.final_dense_fraction * total)
        middle = max(total - warmup - final_dense - final_compressed, 0)
        length = max(round(self.phase_fraction * total), 1)
        count = middle // length
        kinds: list[tuple[int, bool]] = [(warmup, False)]
        kinds += [(length, index % 2 == 0) for index in range(count)]
        kinds.append((total - warmup - count * length - final_compressed, False))
        kinds.append((final_compressed, True))
        phases: list[Phase] = []
        start = 0
        for size, compressed in kinds:
            size = max(min(size, total - start), 0)
            if size == 0:
                continue
            if phases and phases[-1].compressed == compressed:
                phases[-1] = Phase(phases[-1].start, start + size, compressed)
            else:
                phases.append(Phase(start, start + size, compressed))
            start += size
        return tuple(phases)

    def is_compressed(self, step_index: int) -> bool:
        """Whether the optimizer step with 0-based index ``step_index`` runs compressed.

        Indices at or beyond ``total_steps`` count as the last phase.
        """
        if step_index < 0:
            raise ValueError(f"step_index must be >= 0, got {step_index}")
        for phase in self.phases:
            if step_index < phase.stop:
                return phase.compressed
        return self.phases[-1].compressed

    @property
    def compressions(self) -> int:
        """How many times the schedule compresses."""
        return sum(phase.compressed for phase in self.phases)

    def describe(self) -> str:
        """One line, e.g. ``D[0,10) C[10,15) D[15,20) ...``."""
        return " ".join(f"{'C' if p.compressed else 'D'}[{p.start},{p.stop})" for p in self.phases)
