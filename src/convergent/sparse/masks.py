"""Sparsity masks: explicit state keyed by parameter name, and the magnitude rules that build them.

A mask is a bool tensor shaped like its parameter (True = keep). :class:`Masks` holds one per
prunable parameter, applies them (``w <- w * mask``), reports sparsity over the prunable
parameters, round-trips through ``state_dict`` (bool tensors only, so a checkpoint loads with
``weights_only=True``) and can be rebuilt from a sparse checkpoint (``mask = w != 0``).

Builders (scores are magnitudes |w|):

- :func:`global_magnitude_masks`: one threshold over all prunable weights; exactly
  ``round(sparsity * n)`` entries are pruned (equal to ``torch.nn.utils.prune.global_unstructured``
  with ``L1Unstructured`` on the same weights, up to the order of ties);
- :func:`uniform_magnitude_masks`: the same sparsity in every tensor, exact per tensor;
- :func:`n_m_masks`: N:M, the N largest of every M consecutive weights along a layer's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from convergent.sparse.spec import MaskSpec
from convergent.sparse.topk import count_to_prune, keep_largest
from convergent.wording import option


class Masks:
    """One bool mask per parameter name (True = keep).

    Args:
        masks: parameter name -> bool tensor shaped like the parameter.
    """

    def __init__(self, masks: Mapping[str, Tensor]) -> None:
        self._masks: dict[str, Tensor] = {}
        for name, mask in masks.items():
            if mask.dtype != torch.bool:
                raise TypeError(f"the mask of {name!r} must be a bool tensor, got {mask.dtype}")
            self._masks[name] = mask

    def __len__(self) -> int:
        return len(self._masks)

    def __contains__(self, name: object) -> bool:
        return name in self._masks

    def __getitem__(self, name: str) -> Tensor:
        return self._masks[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._masks)

    def items(self) -> Iterator[tuple[str, Tensor]]:
        """(name, mask) pairs."""
        return iter(self._masks.items())

    @property
    def numel(self) -> int:
        """Entries covered by the masks (the prunable parameters' size)."""
        return sum(mask.numel() for mask in self._masks.values())

    @property
    def kept(self) -> int:
        """Entries kept."""
        return sum(int(mask.sum()) for mask in self._masks.values())

    def sparsity(self) -> float:
        """The fraction of covered entries pruned (over prunable parameters only)."""
        total = self.numel
        return 0.0 if total == 0 else 1.0 - self.kept / total

    def per_parameter_sparsity(self) -> dict[str, float]:
        """Pruned fraction of each parameter."""
        return {
            name: 1.0 - int(mask.sum()) / max(mask.numel(), 1) for name, mask in self._masks.items()
        }

    @torch.no_grad()
    def apply(self, model: nn.Module) -> None:
        """Zero the pruned entries of ``model``'s parameters in place."""
        parameters = dict(model.named_parameters())
        for name, mask in self._masks.items():
            if name not in parameters:
                raise KeyError(f"the model has no parameter {name!r} to mask")
            parameter = parameters[name]
            if parameter.shape != mask.shape:
                raise ValueError(
                    f"the mask of {name!r} has shape {tuple(mask.shape)} but the parameter has"
                    f" shape {tuple(parameter.shape)}"
                )
            parameter.mul_(mask.to(device=parameter.device))

    def to(self, device: torch.device | str) -> Masks:
        """The same masks on ``device``."""
        return Masks({name: mask.to(device) for name, mask in self._masks.items()})

    def state_dict(self) -> dict[str, Tensor]:
        """name -> bool tensor (CPU); loads with ``torch.load(weights_only=True)``."""
        return {name: mask.detach().cpu().clone() for name, mask in self._masks.items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Replace the masks with ``state`` (keeping each current mask's device)."""
        devices = {name: mask.device for name, mask in self._masks.items()}
        loaded = Masks(state)
        self._masks = {
            name: mask.to(devices.get(name, mask.device)) for name, mask in loaded.items()
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Tensor]) -> Masks:
        """Masks from :meth:`state_dict`."""
        return cls({name: mask.clone() for name, mask in state.items()})

    @classmethod
    @torch.no_grad()
    def from_weights(cls, model: nn.Module, names: list[str]) -> Masks:
        """Rebuild masks from a sparse model (e.g. a loaded checkpoint): ``mask = w != 0``."""
        parameters = dict(model.named_parameters())
        missing = [name for name in names if name not in parameters]
        if missing:
            raise KeyError(f"the model has no parameter(s) {missing[:5]}")
        return cls({name: parameters[name].detach() != 0 for name in names})

    def broadcast(self, source: int = 0) -> None:
        """Make every process hold rank ``source``'s masks (no-op outside a process group)."""
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        for name, mask in self._masks.items():
            carrier = mask.to(torch.uint8)
            dist.broadcast(carrier, src=source)
            self._masks[name] = carrier.to(torch.bool)


def _parameters(model: nn.Module, names: list[str]) -> list[Tensor]:
    parameters = dict(model.named_parameters())
    missing = [name for name in names if name not in parameters]
    if missing:
        raise KeyError(f"the model has no parameter(s) {missing[:5]}")
    return [parameters[name].detach() for name in names]


def check_sparsity(sparsity: float) -> float:
    """``sparsity`` if it is in [0, 1), else a ValueError: 1 would prune every weight, which
    leaves nothing to train or to rank, so masks refuse it."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(
            f"{option('sparsity')} must be in [0, 1), got {sparsity}"
            + (" (1 would prune every weight)" if sparsity == 1.0 else "")
        )
    return sparsity


def global_magnitude_masks(tensors: Mapping[str, Tensor], sparsity: float) -> Masks:
    """Prune exactly ``round(sparsity * n)`` of the smallest magnitudes over all tensors.

    Args:
        tensors: name -> weight.
        sparsity: the fraction to prune, in [0, 1).
    """
    check_sparsity(sparsity)
    names = list(tensors)
    values = [tensors[name] for name in names]
    k = count_to_prune(sparsity, sum(value.numel() for value in values))
    return Masks(dict(zip(names, keep_largest(values, k), strict=True)))


def uniform_magnitude_masks(tensors: Mapping[str, Tensor], sparsity: float) -> Masks:
    """Prune ``round(sparsity * n_i)`` of the smallest magnitudes of each tensor i (sparsity in
    [0, 1))."""
    check_sparsity(sparsity)
    masks = {}
    for name, value in tensors.items():
        masks[name] = keep_largest([value], count_to_prune(sparsity, value.numel()))[0]
    return Masks(masks)


def n_m_mask(weight: Tensor, n: int, m: int, input_dim: int = 1) -> Tensor:
    """Keep the ``n`` largest magnitudes of every ``m`` consecutive weights along ``input_dim``.

    When the length along ``input_dim`` is not a multiple of ``m``, the trailing group of
    ``r < m`` weights keeps its ``ceil(n * r / m)`` largest.
    """
    if not (isinstance(n, int) and isinstance(m, int) and 1 <= n <= m):
        raise ValueError(f"N:M needs integers 1 <= N <= M, got N={n}, M={m}")
    if weight.ndim < 2:
        raise ValueError(f"N:M masks need a weight with ndim >= 2, got shape {tuple(weight.shape)}")
    if not 0 <= input_dim < weight.ndim:
        raise ValueError(f"input_dim must be in [0, {weight.ndim - 1}], got {input_dim}")
    magnitude = weight.detach().abs().movedim(input_dim, -1)
    length = magnitude.shape[-1]
    mask = torch.zeros_like(magnitude, dtype=torch.bool)
    full = (length // m) * m
    for start, stop, keep in ((0, full, n), (full, length, math.ceil(n * (length - full) / m))):
        if stop == start or keep == 0:
            continue
        group = stop - start if start == full else m
        scores = magnitude[..., start:stop].reshape(*magnitude.shape[:-1], -1, group)
        chosen = scores.topk(keep, dim=-1).indices
        block = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, chosen, True)
        mask[..., start:stop] = block.reshape(*magnitude.shape[:-1], stop - start)
    return mask.movedim(-1, input_dim).contiguous()


def n_m_masks(
    tensors: Mapping[str, Tensor], n: int, m: int, input_dims: Mapping[str, int] | None = None
) -> Masks:
    """:func:`n_m_mask` for every tensor (``input_dims`` per name, 1 by default)."""
    input_dims = input_dims or {}
    return Masks(
        {name: n_m_mask(value, n, m, input_dims.get(name, 1)) for name, value in tensors.items()}
    )


def magnitude_masks(
    model: nn.Module,
    names: list[str],
    sparsity: float = 0.5,
    spec: MaskSpec | None = None,
    input_dims: Mapping[str, int] | None = None,
) -> Masks:
    """Magnitude masks for ``model``'s parameters ``names``.

    Args:
        model: the (unwrapped) model.
        names: the prunable parameter names (see :meth:`MaskSpec.select`).
        sparsity: the fraction to prune, in [0, 1) (ignored for N:M, which prunes 1 - N/M).
        spec: the distribution (``"global"``: one threshold; ``"uniform"``: the same sparsity
            per tensor) and pattern (unstructured or N:M); None is ``MaskSpec()``.
        input_dims: name -> the dimension of a layer's inputs, for N:M (1 by default).
    """
    spec = MaskSpec.given(spec)
    if spec.distribution == "owl":
        raise ValueError(
            "distribution 'owl' sets each block's sparsity from calibration data, so it applies"
            " to one-shot pruning (prune_one_shot) only; use 'uniform' or 'global' here"
        )
    tensors = dict(zip(names, _parameters(model, names), strict=True))
    shape = spec.n_m
    if shape is not None:
        return n_m_masks(tensors, shape[0], shape[1], input_dims)
    if spec.distribution == "global":
        return global_magnitude_masks(tensors, sparsity)
    return uniform_magnitude_masks(tensors, sparsity)


def layer_sparsity(model: nn.Module, names: list[str]) -> list[dict[str, Any]]:
    """The sparsity of each weight ``names`` of ``model``, read from its zeros.

    Args:
        model: the (unwrapped) model.
        names: the weights to report, e.g. ``MaskSpec().select(model).names``.

    Returns:
        One row per weight, in ``names``' order: ``name``, ``shape``, ``entries``, ``zeros``
        and ``sparsity`` (zeros / entries), ready for a table or JSON.
    """
    rows: list[dict[str, Any]] = []
    for name, value in zip(names, _parameters(model, names), strict=True):
        zeros = int((value == 0).sum())
        rows.append(
            {
                "name": name,
                "shape": list(value.shape),
                "entries": value.numel(),
                "zeros": zeros,
                "sparsity": zeros / max(value.numel(), 1),
            }
        )
    return rows
