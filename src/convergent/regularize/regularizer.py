"""`VillaniRegularizer`: one Villani penalty summed over the targeted weights of a model.

With `product=True` the penalty is applied to each LoRA update B A instead of to A and B
separately.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from convergent.regularize.penalties import (
    PENALTIES,
    Penalty,
    _check_eps,
    _check_lam,
    penalty,
)
from convergent.regularize.targets import Syntax, lora_pairs, select_parameters

__all__ = ["VillaniRegularizer"]


class VillaniRegularizer:
    """The sum of one Villani penalty over the targeted weights of a model.

    Example:
        >>> regularizer = VillaniRegularizer(model, "query_key", penalty="log", lam=1e-3)
        >>> loss = task_loss(model(**inputs).logits, labels, "regression") + regularizer()

    Args:
        model: the model whose parameters are penalized (held by reference).
        targets: a preset name ("query_key", "lora"), a pattern, or several patterns.
        penalty: "log" (lam ||W||^2 log(1 + ||W||^2)) or "power" (lam ||W||^(2 + eps)).
        lam: strength, >= 0 (0 gives a zero penalty, handy as a control).
        eps: exponent excess of "power", > 0.
        syntax: "regex" or "glob", for the patterns.
        product: penalize each LoRA update B A (without PEFT's alpha / r scaling) instead of
            the matched tensors; `targets` is then ignored.
    """

    def __init__(
        self,
        model: nn.Module,
        targets: str | Iterable[str] = "query_key",
        penalty: Penalty = "log",
        lam: float = 1e-3,
        eps: float = 1.0,
        *,
        syntax: Syntax = "regex",
        product: bool = False,
    ) -> None:
        if penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}.")
        self.kind = penalty
        self.lam = _check_lam(lam)
        self.eps = _check_eps(eps)
        self.product = product
        self.pairs = lora_pairs(model) if product else []
        self.parameters = {} if product else select_parameters(model, targets, syntax)

    def weights(self, values: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The penalized matrices by name (B A for products), from `values` or the live model."""
        if self.product:
            return {name: b @ a for name, a, b in self.pairs}
        if values is None:
            return dict(self.parameters)
        return {name: values.get(name, parameter) for name, parameter in self.parameters.items()}

    def __call__(self, values: dict[str, Tensor] | None = None) -> Tensor:
        """The total penalty; `values` may replace some targeted parameters (by name)."""
        terms = [
            penalty(weight, self.kind, self.lam, self.eps)
            for weight in self.weights(values).values()
        ]
        return torch.stack(terms).sum()

    @torch.no_grad()
    def norms(self) -> dict[str, float]:
        """||W||_F of each penalized matrix (of B A with `product=True`)."""
        return {name: float(weight.detach().norm()) for name, weight in self.weights().items()}
