"""One specification of a model's masks: which weights may be pruned, and how they are ranked.

Every sparsity entry point takes a :class:`MaskSpec` (one-shot pruning, ``MaskedStep``,
``SparsityCallback``, ``convergent prune`` and ``convergent train``, the studies), so each
option has one default, here:

    spec = MaskSpec(pattern="2:4", include_last=True)
    selection = spec.select(model)              # the prunable weight matrices, and why not others
    masks = magnitude_masks(model, selection.names, 0.5, spec, selection.input_dims)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from convergent.sparse.selection import Selection, select_prunable
from convergent.wording import option

DISTRIBUTIONS = ("global", "uniform", "owl")
PATTERNS = ("unstructured", "n:m")


def parse_pattern(pattern: str) -> tuple[int, int] | None:
    """``"unstructured"`` -> None; ``"2:4"`` -> (2, 4)."""
    if pattern == "unstructured":
        return None
    parts = pattern.split(":")
    if len(parts) == 2 and all(part.strip().isdigit() for part in parts):
        n, m = int(parts[0]), int(parts[1])
        if 1 <= n <= m:
            return n, m
    raise ValueError(
        f"{option('pattern')} must be 'unstructured' or 'N:M' with 1 <= N <= M, got {pattern!r}"
    )


# The dtypes the calibration statistics may be gathered and factorized in, by name.
STATISTICS_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def check_statistics(statistics: str) -> str:
    """``statistics`` if it names one of :data:`STATISTICS_DTYPES`, else one ValueError."""
    if statistics not in STATISTICS_DTYPES:
        raise ValueError(
            f"{option('statistics')} must be one of {', '.join(STATISTICS_DTYPES)}, got"
            f" {statistics!r}"
        )
    return statistics


def as_n_m(pattern: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """A pattern as (N, M), or None for unstructured: a string is parsed
    (:func:`parse_pattern`), an (N, M) pair checked, None passed through."""
    if pattern is None or isinstance(pattern, str):
        return None if pattern is None else parse_pattern(pattern)
    n, m = pattern
    if not (isinstance(n, int) and isinstance(m, int) and 1 <= n <= m):
        raise ValueError(f"an N:M pattern needs integers 1 <= N <= M, got {pattern!r}")
    return n, m


def check_n_m_fits(pattern: str | tuple[int, int] | None, columns: int) -> tuple[int, int] | None:
    """:func:`as_n_m`, and for N:M a check that M divides ``columns``."""
    shape = as_n_m(pattern)
    if shape is not None and columns % shape[1] != 0:
        raise ValueError(
            f"pattern {shape[0]}:{shape[1]} needs the number of inputs to be a multiple of"
            f" M = {shape[1]}, got {columns}"
        )
    return shape


@dataclass(frozen=True)
class MaskSpec:
    """How masks are laid out over a model.

    Attributes:
        distribution: ``"uniform"`` (every prunable matrix loses the same fraction: what
            Wanda and SparseGPT do, and the usual choice for language models),
            ``"global"`` (one magnitude threshold over all prunable weights, as in AC/DC's
            paper; magnitude only) or ``"owl"`` (one-shot pruning only, unstructured:
            outlier-weighted layer-wise sparsity, Yin et al. 2024: each Transformer block
            gets its own sparsity, lower where more of its Wanda scores are outliers; see
            :mod:`convergent.sparse.owl`).
        pattern: ``"unstructured"`` or ``"N:M"`` (at most N nonzeros in every M consecutive
            inputs of a layer, e.g. ``"2:4"``; the sparsity is then 1 - N/M).
        include_embeddings: also prune embedding tables (and a weight tied to one, e.g.
            GPT-2's LM head).
        include_first: prune the first layer too (in module order: a language model's
            first attention projection, which Wanda and SparseGPT prune, or a ViT's patch
            projection, which AC/DC on vision models usually leaves dense: pass False).
        include_last: also prune the last layer (a classifier or an untied LM head).
        exclude: name substrings; a weight whose name contains any of them stays dense.
        owl_m: OWL's outlier threshold M, as a multiple of a block's mean Wanda score
            (llm-compressor's name; the paper's value).
        owl_lmbda: OWL's lambda: the blocks' sparsities span 2 lambda around the target
            (llm-compressor's name; the paper's value).

    The pattern is parsed once, here: :attr:`n_m` holds (N, M), or None when unstructured.
    """

    distribution: str = "uniform"
    pattern: str = "unstructured"
    include_embeddings: bool = False
    include_first: bool = True
    include_last: bool = False
    exclude: tuple[str, ...] = ()
    owl_m: float = 5.0
    owl_lmbda: float = 0.08

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"{option('distribution')} must be one of {DISTRIBUTIONS}, got"
                f" {self.distribution!r}"
            )
        object.__setattr__(self, "_n_m", parse_pattern(self.pattern))
        if self.distribution == "owl" and self.n_m is not None:
            raise ValueError(
                f"{option('distribution', 'owl')} allocates unstructured sparsity; it cannot be"
                f" combined with the N:M pattern {self.pattern!r} (use"
                f" {option('pattern', 'unstructured')})"
            )
        if not (math.isfinite(self.owl_m) and self.owl_m > 0):
            raise ValueError(f"{option('owl_m')} must be a finite number > 0, got {self.owl_m}")
        if not (math.isfinite(self.owl_lmbda) and 0 <= self.owl_lmbda < 0.5):
            raise ValueError(f"{option('owl_lmbda')} must be in [0, 0.5), got {self.owl_lmbda}")
        if isinstance(self.exclude, str):  # a lone string would exclude by its characters
            raise ValueError(
                f"exclude must be a tuple of name substrings, got the string {self.exclude!r}"
            )
        object.__setattr__(self, "exclude", tuple(self.exclude))

    @property
    def n_m(self) -> tuple[int, int] | None:
        """(N, M) for an N:M pattern, None when unstructured (parsed once, when made)."""
        return self._n_m  # type: ignore[attr-defined]

    @classmethod
    def given(cls, spec: MaskSpec | None) -> MaskSpec:
        """``spec``, or the default spec for None; anything else is one error sentence."""
        if spec is None:
            return cls()
        if not isinstance(spec, MaskSpec):
            raise ValueError(
                f"spec must be a MaskSpec (e.g. MaskSpec(distribution='global')), got {spec!r}"
            )
        return spec

    def select(self, model: nn.Module) -> Selection:
        """The weights these masks cover (see :func:`~convergent.sparse.select_prunable`)."""
        return select_prunable(
            model,
            include_embeddings=self.include_embeddings,
            include_first=self.include_first,
            include_last=self.include_last,
            exclude=self.exclude,
        )

    def replace(self, **changes: Any) -> MaskSpec:
        """A copy with ``changes`` (checked like a new spec)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The fields, ready for JSON (``exclude`` as a list)."""
        return {**dataclasses.asdict(self), "exclude": list(self.exclude)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MaskSpec:
        """The inverse of :meth:`as_dict`; unknown keys are one error sentence."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown mask spec fields {unknown}; allowed are {sorted(known)}")
        return cls(**{**values, "exclude": tuple(values.get("exclude", ()))})
