"""Checks of optimizer hyperparameters and gradients, with one-sentence errors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["check_gradient", "check_nonnegative", "check_optional_bool", "check_positive_or_none"]


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a real number, got {value!r} of type {type(value).__name__}."
        )
    return float(value)


def check_nonnegative(name: str, value: Any) -> None:
    """Raises unless `value` is a finite number >= 0."""
    number = _as_float(name, value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")


def check_positive_or_none(name: str, value: Any) -> None:
    """Raises unless `value` is None or a number > 0 (infinity allowed)."""
    if value is None:
        return
    number = _as_float(name, value)
    if not number > 0:
        raise ValueError(f"{name} must be None or a number > 0, got {value!r}.")


def check_betas(value: Any) -> None:
    """Raises unless `value` is a pair of numbers in [0, 1)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"betas must be a pair (beta1, beta2), got {value!r}.")
    for index, item in enumerate(value):
        number = _as_float(f"betas[{index}]", item)
        if not 0 <= number < 1:
            raise ValueError(f"betas[{index}] must be in [0, 1), got {item!r}.")


def check_optional_bool(name: str, value: Any) -> None:
    """Raises unless `value` is None, True or False."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be None (automatic), True or False, got {value!r}.")


def check_gradient(name: str | Callable[[], str], param: Tensor, grad: Tensor) -> None:
    """Raises for gradients the optimizers do not support: sparse, complex, or non-float.

    ``name`` may be a function giving the name: it is called only to word an error (an
    optimizer checks every parameter on every step, and most steps raise nothing).
    """
    if grad.layout == torch.strided and param.is_floating_point() and not grad.is_complex():
        return  # is_floating_point is False for a complex parameter
    named = name() if callable(name) else name
    if grad.is_sparse or grad.layout != torch.strided:
        raise TypeError(
            f"{named} has a sparse gradient; only dense (strided) gradients are supported."
        )
    if torch.is_complex(param) or torch.is_complex(grad):
        raise TypeError(f"{named} is complex; only real floating-point parameters are supported.")
    if not param.is_floating_point():
        raise TypeError(
            f"{named} has dtype {param.dtype}; only floating-point parameters are supported."
        )
