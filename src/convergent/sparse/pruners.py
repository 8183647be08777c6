"""The calibrated one-shot pruners behind one interface, found by name.

A pruner says three things, and the block-by-block driver (:mod:`convergent.sparse.blockwise`)
does the rest (hooks, blocks, devices, ranks, OWL, streaming):

- ``calibrated``: whether it reads calibration inputs at all (magnitude does not);

- ``statistic(inputs, total)``: what it gathers from one batch of a layer's inputs
  ``[..., in]``, added into the earlier batches' ``total`` in place (a new tensor when it is
  None); the statistics of all batches (and ranks) are summed;
- ``prune(rows, statistic, sparsity, n_m, consume)``: how it turns the summed statistic into a
  keep-mask and new weights for the layer's weight ``rows`` ``[out, in]``; ``consume`` says the
  caller reads neither the statistic nor the rows again, so the pruner may work in their memory.

Each method is one module (:mod:`~convergent.sparse.magnitude`, :mod:`~convergent.sparse.wanda`,
:mod:`~convergent.sparse.sparsegpt`) and one entry of :data:`PRUNERS`; its options are its
dataclass fields::

    pruner = make_pruner("sparsegpt", {"block_size": 64})
    new_rows, keep = pruner.prune(rows, summed_hessian, 0.5, None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from torch import Tensor

from convergent.sparse.magnitude import Magnitude
from convergent.sparse.sparsegpt import SparseGPT
from convergent.sparse.wanda import Wanda


class Pruner(Protocol):
    """A one-shot pruner of one layer at a time."""

    name: ClassVar[str]
    calibrated: ClassVar[bool]

    def statistic(self, inputs: Tensor, total: Tensor | None = None) -> Tensor:
        """One batch's statistic of a layer's inputs ``[..., in]``, added into ``total`` (the
        earlier batches' sum) in place and returned, or a new tensor when ``total`` is None."""
        ...

    def prune(
        self,
        rows: Tensor,
        statistic: Tensor,
        sparsity: float,
        n_m: tuple[int, int] | None,
        consume: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """``(new weight, keep mask)`` for ``rows`` ``[out, in]`` from the summed statistic
        (both of which it may overwrite when ``consume``: the caller's last use of them)."""
        ...


PRUNERS: dict[str, type[Pruner]] = {pruner.name: pruner for pruner in (Magnitude, Wanda, SparseGPT)}
METHODS = tuple(PRUNERS)


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`, else one ValueError."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def make_pruner(method: str, options: Mapping[str, Any] | None = None) -> Pruner:
    """The pruner ``method`` with ``options`` (its fields; None: its defaults).

    Raises:
        ValueError: for an unknown method, or an option it does not take.
    """
    cls = PRUNERS[check_method(method)]
    allowed = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(options or {}) - set(allowed))
    if unknown:
        takes = f"takes the options {allowed}" if allowed else "takes no options"
        raise ValueError(f"{method} {takes}, not {unknown}")
    return cls(**dict(options or {}))


def pruner_options(pruner: Pruner) -> dict[str, Any]:
    """The pruner's options (its fields), ready for JSON."""
    return dataclasses.asdict(pruner)  # type: ignore[call-overload]
