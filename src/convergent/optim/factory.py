"""Optimizers by name, with each class's own defaults: the one place that maps names to classes.

``build_optimizer("horst", params, lr=3e-4)`` is ``HORST(params, lr=3e-4)``; an option not
given keeps the default written in the class's signature, so no default has a second copy.
HAM wraps AdamW: its own options (``alpha``, ``beta``, ``mirror``, ``implementation``) go to
HAM, the rest to AdamW.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from convergent.optim.ham import HAM
from convergent.optim.horst import HORST
from convergent.optim.langevin import Langevin

__all__ = ["OPTIMIZERS", "build_optimizer", "decay_groups", "optimizer_default"]

OPTIMIZERS: dict[str, type[Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "horst": HORST,
    "ham": HAM,
    "langevin": Langevin,
}
_NOT_OPTIONS = ("self", "params", "base_optimizer")


def _options(cls: type[Optimizer]) -> dict[str, Any]:
    """The keyword options of ``cls.__init__`` and their defaults."""
    parameters = inspect.signature(cls.__init__).parameters
    return {
        name: parameter.default
        for name, parameter in parameters.items()
        if name not in _NOT_OPTIONS and parameter.kind is not parameter.VAR_KEYWORD
    }


def _check_name(name: str) -> type[Optimizer]:
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    return OPTIMIZERS[name]


def optimizer_default(name: str, option: str) -> Any:
    """The default of ``option`` in optimizer ``name``'s signature (HAM: its own, else AdamW's)."""
    cls = _check_name(name)
    options = _options(cls)
    if name == "ham" and option not in options:
        options = _options(torch.optim.AdamW)
    if option not in options:
        raise ValueError(f"{name} has no option {option!r}; its options are {sorted(options)}")
    return options[option]


def _split(name: str, cls: type[Optimizer], overrides: dict[str, Any]) -> dict[str, Any]:
    known = _options(cls)
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"{name} takes no option(s) {unknown}; its options are {sorted(known)}")
    return overrides


def build_optimizer(name: str, params: Iterable[Any], **overrides: Any) -> Optimizer:
    """The optimizer called ``name`` on ``params`` (tensors or param-group dicts).

    Args:
        name: one of ``OPTIMIZERS`` ("adamw", "sgd", "horst", "ham", "langevin").
        params: what a torch optimizer takes.
        **overrides: options of the class (``lr``, ``alpha``, ...); the rest keep the class's
            defaults. For "ham", HAM's options go to HAM and the others to its AdamW.

    Raises:
        ValueError: an unknown name, or an option the optimizer does not take.
    """
    cls = _check_name(name)
    if name != "ham":
        return cls(params, **_split(name, cls, overrides))
    mirror_names = set(_options(HAM))
    mirror = {key: value for key, value in overrides.items() if key in mirror_names}
    base = {key: value for key, value in overrides.items() if key not in mirror_names}
    adamw = torch.optim.AdamW(params, **_split("ham's AdamW", torch.optim.AdamW, base))
    return HAM(adamw, **mirror)


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two param groups: matrices (ndim >= 2) with ``weight_decay``, the rest (biases, norms)
    without. Frozen parameters are left out."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
