"""Villani regularizers for Langevin training, targeted by parameter name (Frangi et al., 2026).

For a weight matrix W with n = ||W||_F^2, the two penalties are

    log-amplified:   lam * n * log(1 + n)            (= lam ||W||^2 log(1 + ||W||^2))
    super-quadratic: lam * n^(1 + eps / 2)           (= lam ||W||^(2 + eps)),  eps > 0

Both grow faster than ||W||^2, so V~ = loss + penalty satisfies Villani's condition
||grad V~||^2 / s - Laplacian V~ -> infinity as ||W|| -> infinity, which makes Langevin
dynamics on V~ ergodic with a stationary density proportional to exp(-2 V~ / s), even when the
loss alone is flat at infinity (as attention's loss is in W_Q, W_K once the softmax saturates).
`convergent.diagnostics.villani` estimates that quantity along a ray, and
`convergent.train.RegularizedStep` trains on loss + penalty.

Targets are parameter names of `model.named_parameters()`, chosen by regular expressions
(`re.search`) or shell globs (`fnmatch`), or by a preset (`PRESETS`): "query_key" is W_Q and W_K
of our `Transformer` (`q_proj`, `k_proj`) and of Hugging Face BERT (`query`, `key`); "lora" is
the LoRA factors A and B of a PEFT model. With `product=True` the penalty is applied to each
LoRA update B A instead of to A and B separately.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from collections.abc import Iterable, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = [
    "PENALTIES",
    "PRESETS",
    "VillaniRegularizer",
    "diffusion_radius",
    "lam_for_stationary_radius",
    "log_amplified_penalty",
    "lora_pairs",
    "penalty",
    "radial_relaxation_time",
    "select_parameters",
    "stationary_radius",
    "super_quadratic_penalty",
]

Penalty = Literal["log", "power"]
Syntax = Literal["regex", "glob"]
PENALTIES: tuple[str, ...] = ("log", "power")
PRESETS: dict[str, tuple[str, ...]] = {
    "query_key": (r"(^|\.)(q_proj|query)\.weight$", r"(^|\.)(k_proj|key)\.weight$"),
    "lora": (r"(^|\.)lora_A\.", r"(^|\.)lora_B\."),
}
# The same projection under its two usual names (ours / Hugging Face BERT), for error hints.
_ALIASES = {
    "q_proj": "query",
    "k_proj": "key",
    "v_proj": "value",
    "query": "q_proj",
    "key": "k_proj",
    "value": "v_proj",
}
_LORA_A = re.compile(r"^(?P<prefix>.*)\.lora_A\.(?P<adapter>[^.]+)\.weight$")


def _check_lam(lam: float) -> float:
    if (
        isinstance(lam, bool)
        or not isinstance(lam, (int, float))
        or not (math.isfinite(lam) and lam >= 0)
    ):
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}.")
    return float(lam)


def _check_eps(eps: float) -> float:
    if (
        isinstance(eps, bool)
        or not isinstance(eps, (int, float))
        or not (math.isfinite(eps) and eps > 0)
    ):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}.")
    return float(eps)


def log_amplified_penalty(weight: Tensor, lam: float) -> Tensor:
    """lam * ||W||_F^2 * log(1 + ||W||_F^2), smooth everywhere (also at W = 0)."""
    lam = _check_lam(lam)
    squared = weight.pow(2).sum()
    return lam * squared * torch.log1p(squared)


def super_quadratic_penalty(weight: Tensor, lam: float, eps: float) -> Tensor:
    """lam * ||W||_F^(2 + eps), computed as lam * (||W||_F^2)^(1 + eps / 2) (smooth at 0)."""
    lam, eps = _check_lam(lam), _check_eps(eps)
    return lam * weight.pow(2).sum().pow(1 + eps / 2)


def penalty(weight: Tensor, kind: str, lam: float, eps: float = 1.0) -> Tensor:
    """The penalty `kind` ("log" or "power") of `weight`; `eps` is used by "power" only."""
    if kind == "log":
        return log_amplified_penalty(weight, lam)
    if kind == "power":
        return super_quadratic_penalty(weight, lam, eps)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {kind!r}.")


def _penalty_slope(kind: str, squared_norm: float, eps: float) -> float:
    """d penalty / d n at n = ||W||^2, per unit lam."""
    if kind == "log":
        return math.log1p(squared_norm) + squared_norm / (1 + squared_norm)
    if kind == "power":
        return (1 + eps / 2) * squared_norm ** (eps / 2)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {kind!r}.")


def _penalty_curvature(kind: str, squared_norm: float, eps: float) -> float:
    """d^2 penalty / d n^2 at n = ||W||^2, per unit lam."""
    if kind == "log":
        return 1 / (1 + squared_norm) + 1 / (1 + squared_norm) ** 2
    if kind == "power":
        return (1 + eps / 2) * (eps / 2) * squared_norm ** (eps / 2 - 1)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {kind!r}.")


def lam_for_stationary_radius(
    kind: str, radius: float, numel: int, s: float, eps: float = 1.0
) -> float:
    """The lam whose penalty alone puts the most likely ||W||_F at `radius` under Langevin.

    With a flat loss, the stationary density exp(-2 lam g(||W||^2) / s) of a matrix with
    `numel` entries gives ||W||_F = r the density r^(numel - 1) exp(-2 lam g(r^2) / s),
    whose mode solves (numel - 1) = (4 lam / s) r^2 g'(r^2). This returns that lam.
    """
    if not (radius > 0 and s > 0 and numel >= 2):
        raise ValueError(
            f"radius and s must be > 0 and numel >= 2, got {radius!r}, {s!r}, {numel!r}."
        )
    squared = float(radius) ** 2
    return s * (numel - 1) / (4 * squared * _penalty_slope(kind, squared, eps))


def stationary_radius(kind: str, lam: float, numel: int, s: float, eps: float = 1.0) -> float:
    """The inverse of `lam_for_stationary_radius`: the mode of ||W||_F, inf when lam = 0."""
    lam = _check_lam(lam)
    if lam == 0:
        return math.inf
    target = s * (numel - 1) / (4 * lam)
    low, high = 0.0, 1.0
    while high**2 * _penalty_slope(kind, high**2, eps) < target:
        high *= 2
    for _ in range(100):  # r^2 g'(r^2) increases with r: bisection
        middle = (low + high) / 2
        low, high = (
            (middle, high)
            if middle**2 * _penalty_slope(kind, middle**2, eps) < target
            else (low, middle)
        )
    return (low + high) / 2


def _matches(pattern: str, name: str, syntax: str) -> bool:
    if syntax == "glob":
        return fnmatch.fnmatchcase(name, pattern)
    return re.search(pattern, name) is not None


def _close_matches(pattern: str, names: Sequence[str]) -> list[str]:
    """Parameter names that look like `pattern`: by their dotted parts, then as a whole."""
    bare = re.sub(r"[^A-Za-z0-9_.]", "", pattern.replace(r"\.", ".")).strip(".")
    parts = sorted({part for name in names for part in name.split(".")})
    close_parts = set()
    for piece in [bare, *bare.split(".")]:
        close_parts.update(difflib.get_close_matches(piece, parts, n=3, cutoff=0.6))
        if _ALIASES.get(piece) in parts:
            close_parts.add(_ALIASES[piece])
    found = [name for name in names if close_parts & set(name.split("."))]
    found += difflib.get_close_matches(bare, names, n=3, cutoff=0.5)
    return list(dict.fromkeys(found))[:6]


def select_parameters(
    model: nn.Module, patterns: str | Iterable[str], syntax: Syntax = "regex"
) -> dict[str, nn.Parameter]:
    """The parameters of `model` whose names match any of `patterns`, in model order.

    Args:
        model: any module.
        patterns: a preset name (a key of `PRESETS`), or one pattern, or several; every
            pattern must match at least one parameter.
        syntax: "regex" (`re.search` on the full name) or "glob" (`fnmatch` on the full name,
            e.g. "*.q_proj.weight"); presets are always regular expressions.

    Raises:
        ValueError: naming a pattern that matches nothing, with the closest parameter names.
    """
    if syntax not in ("regex", "glob"):
        raise ValueError(f"syntax must be 'regex' or 'glob', got {syntax!r}.")
    if isinstance(patterns, str) and patterns in PRESETS:
        patterns, syntax = PRESETS[patterns], "regex"
    pattern_list = [patterns] if isinstance(patterns, str) else list(patterns)
    if not pattern_list:
        raise ValueError("patterns is empty; give a preset name or at least one pattern.")
    named = dict(model.named_parameters())
    selected: dict[str, nn.Parameter] = {}
    for pattern in pattern_list:
        if syntax == "regex":
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(
                    f"pattern {pattern!r} is not a valid regular expression: {error}."
                ) from None
        hits = [name for name in named if _matches(pattern, name, syntax)]
        if not hits:
            close = _close_matches(pattern, list(named))
            hint = f"close matches: {', '.join(close)}" if close else "no parameter name is close"
            raise ValueError(
                f"pattern {pattern!r} ({syntax}) matches no parameter of "
                f"{type(model).__name__}; {hint}."
            )
        selected.update({name: named[name] for name in hits})
    return {name: selected[name] for name in named if name in selected}


def lora_pairs(model: nn.Module) -> list[tuple[str, nn.Parameter, nn.Parameter]]:
    """(module name, A, B) for every PEFT LoRA layer: `X.lora_A.<adapter>.weight` with its B."""
    named = dict(model.named_parameters())
    pairs = []
    for name, parameter in named.items():
        found = _LORA_A.match(name)
        if found is None:
            continue
        partner = f"{found['prefix']}.lora_B.{found['adapter']}.weight"
        if partner not in named:
            raise ValueError(f"LoRA factor {name!r} has no partner {partner!r}.")
        pairs.append((f"{found['prefix']}.{found['adapter']}", parameter, named[partner]))
    if not pairs:
        close = _close_matches("lora_A", list(named))
        hint = f"close matches: {', '.join(close)}" if close else "no parameter name is close"
        raise ValueError(f"no LoRA factor (*.lora_A.*.weight) in {type(model).__name__}; {hint}.")
    return pairs


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


def radial_relaxation_time(kind: str, lam: float, numel: int, s: float, eps: float = 1.0) -> float:
    """How long ||W||_F takes to settle at its stationary radius under the penalty alone.

    With a flat loss, r = ||W||_F of a matrix with ``numel`` entries follows (Ito)
    dr = [s (numel - 1) / (2 r) - 2 lam r g'(r^2)] dt + sqrt(s) dB, whose drift vanishes at the
    stationary radius r*. Linearized there, r - r* decays as exp(-kappa t) with
    kappa = s (numel - 1) / r*^2 + 4 lam r*^2 g''(r*^2). Returns 1 / kappa, in the time of
    dT = -grad V dt + sqrt(s) dB: divide by the step size for steps (``Langevin`` moves
    lr time units per step). A run that tests boundedness should last several of these.

    Args:
        kind: "log" or "power".
        lam: the penalty's weight, > 0.
        numel: entries of the matrix, >= 2.
        s: the diffusion coefficient, > 0.
        eps: the super-quadratic exponent excess ("power" only).

    Returns:
        The relaxation time 1 / kappa.
    """
    if not (lam > 0 and s > 0 and numel >= 2):
        raise ValueError(
            f"lam and s must be > 0 and numel >= 2, got lam={lam!r}, s={s!r}, numel={numel!r}."
        )
    radius = stationary_radius(kind, lam, numel, s, eps)
    squared = radius**2
    kappa = s * (numel - 1) / squared + 4 * lam * squared * _penalty_curvature(kind, squared, eps)
    return 1.0 / kappa


def diffusion_radius(start_norm: float, numel: int, s: float, time: float) -> float:
    """The root-mean-square ||W||_F after ``time`` of pure noise: sqrt(start^2 + numel s time).

    Without a regularizer and with a flat loss each entry of W gains variance s per unit time
    (``Langevin`` adds N(0, lr s) per step, lr time units), so E ||W_t||^2 = ||W_0||^2 +
    numel s t: the growth an unregularized run shows from the noise alone.
    """
    if not (start_norm >= 0 and numel >= 1 and s >= 0 and time >= 0):
        raise ValueError(
            "start_norm, s and time must be >= 0 and numel >= 1, got "
            f"start_norm={start_norm!r}, numel={numel!r}, s={s!r}, time={time!r}."
        )
    return math.sqrt(start_norm**2 + numel * s * time)
