"""The non-finite-gradient guard that HORST, HAM and Langevin run before they change anything.

One call per step, before any parameter, optimizer state or noise generator is touched:

    bad = first parameter whose gradient holds a NaN or an infinity (the smallest over ranks)
    bad is None: step;  nonfinite == "raise": ValueError naming bad;  "skip": skip the step
    nonfinite == "ignore": no check (a NaN then spreads into the weights and the state)

Under a process group every rank takes the same decision (see `_sharding.agree_on_first`), so
FSDP2 shards and DDP replicas stay in step; every rank must then call `step()`, as DDP and
FSDP do.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from convergent.optim import _sharding

__all__ = [
    "NONFINITE_OPTIONS",
    "Nonfinite",
    "abs_maxima",
    "check_nonfinite_option",
    "first_nonfinite",
    "parameter_name",
    "skip_for_nonfinite_gradient",
]

Nonfinite = Literal["raise", "skip", "ignore"]
# "ignore" skips the check, as torch.optim does: for a loop that checks already (GradScaler's
# found_inf, a trainer's own test of the loss), where the extra read of every gradient is pure
# cost (about 0.2x of a fused AdamW step on CPU, see benchmarks/optimizer_step.py).
NONFINITE_OPTIONS = ("raise", "skip", "ignore")


class NonFiniteGradientError(ValueError, FloatingPointError):
    """A gradient held NaN or infinity, so the optimizer refused the step.

    A ``ValueError`` (the value handed to ``step`` is bad) and a ``FloatingPointError`` (the
    training diverged): code that treats a diverged run as a result, as a tuning grid does,
    catches it with :class:`~convergent.train.TrainingDiverged` as one ``FloatingPointError``.
    """


def check_nonfinite_option(value: Any) -> None:
    """Raises unless `value` is one of `NONFINITE_OPTIONS`."""
    if value not in NONFINITE_OPTIONS:
        raise ValueError(f"nonfinite must be one of {NONFINITE_OPTIONS}, got {value!r}.")


def first_nonfinite(tensors: list[Tensor]) -> int | None:
    """The index of the first tensor holding a NaN or an infinity, or None.

    One read of each tensor and one synchronization per device: each tensor's sum, which is
    finite only if every entry is (NaN and infinities propagate through a sum). A sum that is
    not finite is confirmed by the tensor's min and max (`abs_maxima`), since finite entries
    can overflow their sum (a float16 gradient of 40,000 entries of 100 does). A sum is one
    reduction per element where min and max are two: the guard reads faster.
    """
    suspects: list[int] = []
    for indices in _indices_by_device(tensors):
        sums = torch.stack([_dense_values(tensors[index]).sum() for index in indices])
        finite = torch.isfinite(sums).tolist()
        suspects.extend(index for index, ok in zip(indices, finite, strict=True) if not ok)
    if not suspects:
        return None
    suspects.sort()
    maxima = abs_maxima([tensors[index] for index in suspects])
    bad = _first_not_finite(maxima)
    return None if bad is None else suspects[bad]


def _indices_by_device(tensors: list[Tensor]) -> list[list[int]]:
    """The tensors' indices grouped by device, in order: one synchronization per group."""
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    return list(by_device.values())


def _first_not_finite(values: list[float]) -> int | None:
    return next((index for index, value in enumerate(values) if not math.isfinite(value)), None)


def abs_maxima(tensors: list[Tensor]) -> list[float]:
    """max |x| of each tensor (0 for an empty one), NaN or inf where it holds a NaN or an
    infinity: one read per tensor (its min and max, which both propagate NaN), one
    synchronization per device. HAM's guard, whose maxima also bound its exponent, and the
    confirmation of `first_nonfinite`'s suspects."""
    maxima = [0.0] * len(tensors)
    for indices in _indices_by_device(tensors):
        extremes = [_extremes(tensors[index]) for index in indices]
        low = torch.stack([pair[0] for pair in extremes]).double()
        high = torch.stack([pair[1] for pair in extremes]).double()
        # maximum propagates NaN.
        values = torch.maximum(low.abs(), high.abs()).tolist()
        for index, value in zip(indices, values, strict=True):
            maxima[index] = value
    return maxima


def _stored_values(tensor: Tensor) -> Tensor:
    """The stored values of ``tensor``, real: a sparse tensor's values, a complex one's parts."""
    if tensor.layout == torch.sparse_coo:  # a base optimizer under HAM may take sparse grads
        tensor = tensor._values()
    elif tensor.layout != torch.strided:
        tensor = tensor.values()
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor


def _dense_values(tensor: Tensor) -> Tensor:
    """What the finiteness screen sums: the stored values, or a float zero for an integer
    tensor (always finite) and an empty one."""
    values = _stored_values(tensor)
    if not values.is_floating_point() or values.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=values.device)
    return values


def _extremes(tensor: Tensor) -> tuple[Tensor, Tensor]:
    values = _stored_values(tensor)
    if values.numel() == 0:
        zero = torch.zeros((), dtype=torch.float64, device=values.device)
        return zero, zero
    if not values.is_floating_point():
        values = values.double()  # integer gradients are finite; aminmax needs a float here
    low, high = torch.aminmax(values)
    return low, high


def parameter_name(group: dict[str, Any], group_index: int, param_index: int) -> str:
    """How errors name a parameter: by its name if the optimizer was given named parameters,
    else by its place ("parameter 1 of param group 0 (shape [6])")."""
    if "param_names" in group:
        return f"parameter {group['param_names'][param_index]!r}"
    shape = list(group["params"][param_index].shape)
    return f"parameter {param_index} of param group {group_index} (shape {shape})"


def skip_for_nonfinite_gradient(
    optimizer_name: str,
    param_groups: list[dict[str, Any]],
    nonfinite: Nonfinite,
    maxima: dict[int, float] | None = None,
) -> bool:
    """Whether this step must be skipped because a gradient is NaN or infinite.

    Looks at every parameter with a gradient, in group order; under a process group the
    answer is agreed across ranks (a NaN in one rank's shard or replica counts on all).

    Args:
        optimizer_name: names the optimizer in the error ("HORST", "HAM", "Langevin").
        param_groups: the optimizer's param groups.
        nonfinite: "raise", "skip" or "ignore" (no check: False at once, ``maxima`` left
            empty).
        maxima: if given, filled with id(param) -> max |grad| over this rank's part (a
            compiled step bounds its exponent with it); the guard then reads each gradient's
            min and max instead of its sum.

    Returns:
        True when some gradient is not finite and `nonfinite` is "skip"; False when all are
        finite.

    Raises:
        NonFiniteGradientError: some gradient is not finite and `nonfinite` is "raise"; it
            names the first such parameter (the smallest index over ranks).
    """
    if nonfinite == "ignore":
        return False
    grads: list[Tensor] = []
    places: list[tuple[int, int]] = []
    for group_index, group in enumerate(param_groups):
        for param_index, param in enumerate(group["params"]):
            if param.grad is not None:
                grads.append(param.grad)
                places.append((group_index, param_index))
    local = [_sharding.local(grad) for grad in grads]
    if maxima is None:
        first = first_nonfinite(local)
    else:
        local_maxima = abs_maxima(local)
        for (group_index, param_index), value in zip(places, local_maxima, strict=True):
            maxima[id(param_groups[group_index]["params"][param_index])] = value
        first = _first_not_finite(local_maxima)
    bad = _sharding.agree_on_first(first, grads)
    if bad is None:
        return False
    if nonfinite == "skip":
        return True
    if bad < len(places):
        group_index, param_index = places[bad]
        name = parameter_name(param_groups[group_index], group_index, param_index)
    else:  # only when ranks disagree on which parameters have gradients
        name = f"a parameter on another rank (number {bad} there)"
    raise NonFiniteGradientError(
        f"{optimizer_name}: the gradient of {name} is not finite; "
        "pass nonfinite='skip' to skip such steps."
    )
