"""One pruning request: what ``convergent prune`` (or a Python caller) asks for, checked once.

:class:`PruneRequest` holds every option of a pruning: the targets, the method and the masks'
layout, the calibration, the evaluation data, where and in which dtype, whether to stream, and
what to save. It is checked when built, before any model is read, and its messages name the
options as the caller gave them (:func:`~convergent.wording.option`: ``--save`` under the
command line, ``save_to`` in Python). Each prune path takes one
(:func:`~convergent.commands.prune.prune_run`, the Hugging Face folder's in-memory path, and
:func:`~convergent.commands.prune_streamed.prune_hf_folder_streamed`), so a new option is a
field here plus the code that reads it; its default is this class's, which the command's help
quotes (:func:`request_default`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from convergent.commands.compressed import check_save_folder
from convergent.commands.pruned_folder import SaveOptions
from convergent.models.placement import check_device
from convergent.sparse import MaskSpec
from convergent.sparse.masks import check_sparsity
from convergent.sparse.oneshot import check_one_shot
from convergent.sparse.spec import check_statistics
from convergent.wording import option

DEFAULT_SPARSITIES = (0.5, 0.7, 0.9)
CALIBRATION_BATCH_SIZE = 16
# Options that only a Hugging Face folder takes: a run brings its own data, and it is never
# streamed.
HF_ONLY = ("data", "examples", "max_length", "seed", "calibration_data", "low_memory")


@dataclass(frozen=True)
class PruneRequest:
    """A one-shot pruning, as asked for; checked when built.

    Attributes:
        sparsities: targets in [0, 1) (None: ``DEFAULT_SPARSITIES``; an N:M pattern prunes
            1 - N/M, its one target). The targets pruned to are ``targets``.
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        spec: which weights, the distribution and the pattern (None: ``MaskSpec()``).
        statistics: the dtype Wanda's and SparseGPT's calibration statistics are gathered
            and factorized in, ``"float64"`` or ``"float32"``.
        calibration_data: the source whose *train* split Wanda and SparseGPT calibrate on
            (None: ``data``'s; a run calibrates on its own training split).
        calibration_examples: how many training examples they (and OWL) calibrate on.
        calibration_batch_size: calibration examples run through a block at once (fewer hold
            less activation memory at a time; the statistics are sums over all of them).
        data: the data a Hugging Face folder is evaluated on (None: ``austen`` for a causal
            LM, ``rt-sentences`` for a classifier).
        examples: evaluate on the first this many validation examples (None: all).
        max_length: tokens per example.
        seed: the split seed (and the calibration sample's).
        device: where blocks are calibrated, pruned and evaluated (None: the model's device);
            the model stays in CPU memory.
        dtype: the dtype to load, prune and save in (None: the folder's or checkpoint's).
        low_memory: True streams a Hugging Face folder's blocks from its safetensors files,
            one in memory at a time, into ``save_to`` (one target); False loads it whole;
            None chooses by the memory available
            (:func:`~convergent.commands.prune_memory.chooses_streaming`).
        save_to: a new (or empty) folder for the model pruned at the last target, with its
            report (``pruning.json``, ``pruning.md``, ``pruning.png``).
        save: how ``save_to`` is written (compressed by default; None: ``SaveOptions()``).
        progress: progress bars over the blocks.
    """

    sparsities: tuple[float, ...] | None = None
    method: str = "magnitude"
    spec: MaskSpec | None = None
    statistics: str = "float64"
    calibration_data: str | None = None
    calibration_examples: int = 128
    calibration_batch_size: int = CALIBRATION_BATCH_SIZE
    data: str | None = None
    examples: int | None = None
    max_length: int = 64
    seed: int = 0
    device: str | torch.device | None = None
    dtype: torch.dtype | None = None
    low_memory: bool | None = None
    save_to: str | Path | None = None
    save: SaveOptions | None = None
    progress: bool = False
    # Derived when built, from the fields above.
    targets: tuple[float, ...] = field(init=False)
    pruner_options: dict[str, Any] | None = field(init=False)
    compute: torch.device | None = field(init=False)

    def __post_init__(self) -> None:
        spec = MaskSpec.given(self.spec)
        _set(self, "spec", spec)
        _set(self, "save", self.save or SaveOptions())
        if self.save_to is not None:
            _set(self, "save_to", Path(self.save_to))
        _set(self, "targets", resolve_targets(self.sparsities, spec))
        _set(self, "pruner_options", pruner_options_for(self.method, self.statistics))
        check_one_shot(self.method, spec, self.pruner_options)
        check_calibration_examples(self.calibration_examples)
        if self.calibration_batch_size < 1:
            raise ValueError(
                f"{option('calibration_batch_size', self.calibration_batch_size)} is out of"
                " range; it must be >= 1."
            )
        _set(self, "compute", check_device(self.device, self.dtype))
        if self.save_to is not None:
            check_save_folder(self.save_to)
        if self.low_memory:
            check_streamable(self)

    @property
    def mask_spec(self) -> MaskSpec:
        """``spec``, never None once built."""
        assert self.spec is not None
        return self.spec

    @property
    def save_options(self) -> SaveOptions:
        """``save``, never None once built."""
        assert self.save is not None
        return self.save

    @property
    def calibrates(self) -> bool:
        """Whether the pruning reads calibration data: Wanda, SparseGPT, or OWL's allocation."""
        return self.method != "magnitude" or self.mask_spec.distribution == "owl"

    def changed_hf_only(self) -> list[str]:
        """The options of ``HF_ONLY`` set to other than their defaults."""
        return [name for name in HF_ONLY if getattr(self, name) != request_default(name)]


def _set(request: PruneRequest, name: str, value: Any) -> None:
    object.__setattr__(request, name, value)


def request_default(name: str) -> Any:
    """The default of :class:`PruneRequest`'s field ``name`` (its one definition)."""
    return {item.name: item.default for item in dataclasses.fields(PruneRequest)}[name]


def request_of(
    sparsities: tuple[float, ...] | None, request: PruneRequest | None, options: dict[str, Any]
) -> PruneRequest:
    """The request of a library call: ``request``, or one built from ``sparsities`` and the
    keyword ``options`` (:class:`PruneRequest`'s fields), not both."""
    if request is None:
        return PruneRequest(sparsities=sparsities, **options)
    if sparsities is not None or options:
        raise TypeError("pass a PruneRequest or its fields as keywords, not both")
    return request


def resolve_targets(sparsities: tuple[float, ...] | None, spec: MaskSpec) -> tuple[float, ...]:
    """The targets to prune to: ``sparsities`` (None: :data:`DEFAULT_SPARSITIES`), or for an
    N:M pattern its one sparsity 1 - N/M, which a conflicting target may not contradict."""
    if spec.n_m is None:
        targets = tuple(sparsities) if sparsities else DEFAULT_SPARSITIES
        for target in targets:
            check_sparsity(target)
        return targets
    n, m = spec.n_m
    implied = 1 - n / m
    conflicting = [t for t in sparsities or () if not math.isclose(t, implied, abs_tol=1e-9)]
    if conflicting:
        raise ValueError(
            f"{option('pattern', spec.pattern)} prunes 1 - N/M = {implied:g} of every layer, so"
            f" {option('sparsity')} must be {implied:g} or left out, got {conflicting[0]:g}"
        )
    return (implied,)


def pruner_options_for(method: str, statistics: str) -> dict[str, Any] | None:
    """The pruner options the commands pass: the statistics' dtype, for the calibrated
    methods (magnitude gathers none)."""
    check_statistics(statistics)
    return None if method == "magnitude" else {"statistics": statistics}


def check_calibration_examples(calibration_examples: int) -> None:
    """Refuse a calibration sample of fewer than one example, naming its own option."""
    if calibration_examples < 1:
        raise ValueError(
            f"{option('calibration_examples', calibration_examples)} is out of range; it must"
            " be >= 1."
        )


def streaming_blocker(request: PruneRequest) -> str | None:
    """Why ``request`` cannot be streamed, as the end of a sentence (None: it can be)."""
    if request.save_to is None:
        return (
            f"{option('low_memory')} writes the pruned model one block at a time; name the"
            f" folder to write it to with {option('save_to')}"
        )
    if len(request.targets) != 1:
        return (
            f"{option('low_memory')} prunes to one target per call (it never copies the"
            f" model), so give one {option('sparsity')}, got {len(request.targets)}:"
            f" {', '.join(f'{t:g}' for t in request.targets)}"
        )
    return None


def check_streamable(request: PruneRequest) -> None:
    """Refuse a streamed request that has no ``save_to`` or several targets."""
    blocker = streaming_blocker(request)
    if blocker is not None:
        raise ValueError(blocker)


def refuse_hf_only(names: list[str], path: str | Path) -> None:
    """Refuse the Hugging-Face-only options ``names`` for the run at ``path``."""
    if names:
        named = ", ".join(option(name) for name in names)
        raise ValueError(
            f"{named} {'apply' if len(names) > 1 else 'applies'} only to Hugging Face model"
            f" folders; the run at {path} brings its own data (scored on its validation split,"
            " calibrated on its training split)"
        )
