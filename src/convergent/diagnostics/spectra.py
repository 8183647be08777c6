"""Singular values of the attention output, per layer and per example, through forward hooks.

For a layer with input X (the residual stream, T x d) and attention output A = Attn(X)
(after the output projection, before the residual is added), we report

    sigma_min(A), sigma_max(A), kappa(A) = sigma_max / sigma_min,

and the same for the residual branch R = beta * X + A. sigma_min is the smallest of the
min(T, d) singular values of the kept (non-padding) rows. The residual pillar's claim is
that the rate of gradient descent on a one-layer Transformer is set by
sigma_min^2 / sigma_max^2, and that beta > 0 keeps sigma_min away from zero where softmax
collapses rank.

Hooks work on our `Transformer` (`SelfAttention` under `blocks[i].attention`), on Hugging
Face BERT-family encoders (`BertAttention`-like modules: a `self` child owning the
query/key projections and an `output` child with `dense`), on Llama-style decoders
(`q_proj`/`k_proj`/`o_proj`) and on GPT-2 (`c_attn`, Q, K and V fused, and `c_proj`). X is
read where the layer (block) takes it, so that under pre-norm it is the residual stream, not
its normalized copy. They never change train/eval mode.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# (query, key, output) leaf names of attention modules that apply their own output projection.
_DIRECT_FAMILIES: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "o_proj"),  # ours, LLaMA-style
    ("q_proj", "k_proj", "out_proj"),
    ("q_lin", "k_lin", "out_lin"),  # DistilBERT
    ("c_attn", "c_proj"),  # GPT-2: Q, K and V in one fused projection
)
# Modules that only hold layers: never the layer whose input is the residual stream.
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
# (query, key) leaf names inside the `self` child of BERT-family attention modules.
_BERT_FAMILIES: tuple[tuple[str, str], ...] = (("query", "key"), ("q_proj", "k_proj"))


@dataclass(frozen=True)
class AttentionSite:
    """Where to read one layer's residual input X and attention output Attn(X).

    Attributes:
        name: the attention module's qualified name, e.g. ``blocks.0.attention``.
        input_module: a forward pre-hook here sees X.
        input_position: X's position among that module's positional arguments.
        input_keyword: X's name when passed as a keyword argument.
        output_module: a forward hook here sees Attn(X) (the first element of a tuple output).
        beta: the residual coefficient of this layer (1.0 unless the model says otherwise).
    """

    name: str
    input_module: nn.Module
    input_position: int
    input_keyword: str
    output_module: nn.Module
    beta: float


def _has_children(module: nn.Module, names: tuple[str, ...]) -> bool:
    children = dict(module.named_children())
    return all(name in children for name in names)


def _first_argument(module: nn.Module) -> str:
    """The name of the first argument of ``module``'s forward (where it takes X)."""
    parameters = list(inspect.signature(module.forward).parameters)
    return parameters[0] if parameters else "hidden_states"


def _direct_site(name: str, parent: nn.Module, child: nn.Module) -> AttentionSite:
    """The site of an attention module ``child`` that projects its own output: X is what its
    layer ``parent`` takes (our Block also holds beta), or the attention's own input when it
    sits directly in a container."""
    # GPT-2's cross-attention (q_attn) attends to another sequence: its own input is X.
    own = isinstance(parent, _CONTAINERS) or _has_children(child, ("q_attn",))
    layer = child if own else parent
    return AttentionSite(
        name=name,
        input_module=layer,
        input_position=0,
        input_keyword=_first_argument(layer),
        output_module=child,
        beta=float(getattr(parent, "beta", 1.0)),
    )


def find_attention_sites(model: nn.Module) -> list[AttentionSite]:
    """The attention layers of ``model``, in forward order.

    Raises:
        ValueError: when no attention module is recognised; the message lists the module
            types that were seen.
    """
    sites: list[AttentionSite] = []
    claimed: set[int] = set()
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) in claimed:
                continue
            if any(_has_children(child, family) for family in _DIRECT_FAMILIES):
                sites.append(_direct_site(name, parent, child))
                claimed.add(id(child))
                claimed.update(id(m) for m in child.modules())
            elif _has_children(child, ("self", "output")) and hasattr(child.output, "dense"):
                inner = child.self
                if any(_has_children(inner, family) for family in _BERT_FAMILIES):
                    # BertSelfOutput(context, input_tensor) = LN(dropout(dense(context)) +
                    # beta * input_tensor): X is its second argument, Attn(X) is dense's output.
                    sites.append(
                        AttentionSite(
                            name=name,
                            input_module=child.output,
                            input_position=1,
                            input_keyword="input_tensor",
                            output_module=child.output.dense,
                            beta=float(getattr(child.output, "beta", 1.0)),
                        )
                    )
                    claimed.update(id(m) for m in child.modules())
    if not sites:
        seen = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(
            f"no attention modules found in {type(model).__name__}; expected modules owning "
            f"q_proj/k_proj/o_proj (ours, Llama-style), c_attn/c_proj (GPT-2) or a BERT-style "
            f"attention with self.query/self.key and output.dense; module types seen: "
            f"{', '.join(seen)}"
        )
    return sites


def singular_values(matrices: torch.Tensor, method: str = "gram") -> torch.Tensor:
    """All min(T, d) singular values of each ``[T, d]`` matrix, descending, ``[B, min(T, d)]``.

    Args:
        matrices: ``[B, T, d]``.
        method: ``"svd"`` (the reference: ``torch.linalg.svdvals``) or ``"gram"`` (the fast
            path: square roots of the eigenvalues of the smaller Gram matrix, X X^T or X^T X,
            formed in float64). The Gram path resolves singular values down to about
            1e-8 * sigma_max, finer than float32 inputs carry, at about half the cost.
    """
    if method == "svd":
        values = matrices if matrices.dtype == torch.float64 else matrices.float()
        return torch.linalg.svdvals(values)
    if method != "gram":
        raise ValueError(f"method={method!r} is not supported; allowed values are 'svd', 'gram'.")
    values = matrices.double()
    length, width = values.shape[-2], values.shape[-1]
    gram = values @ values.mT if length <= width else values.mT @ values
    eigenvalues = torch.linalg.eigvalsh(gram).clamp(min=0.0).flip(-1)
    result = eigenvalues.sqrt()
    return result if matrices.dtype == torch.float64 else result.float()


def singular_value_extremes(
    matrices: torch.Tensor, keep: torch.Tensor | None = None, method: str = "gram"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and largest singular value of each ``[T, d]`` matrix, padding rows left out.

    Rows of padding are zeroed; the kept rows' singular values are then the top
    min(T_kept, d) values of the padded matrix, so one batched call serves all lengths.

    Args:
        matrices: ``[B, T, d]``.
        keep: bool ``[B, T]``, True = a real token; ``None`` keeps every row.
        method: ``"gram"`` (fast) or ``"svd"`` (reference); see `singular_values`.

    Returns:
        ``(sigma_min, sigma_max)``, each ``[B]`` (float32, or float64 for float64 input).
    """
    values = matrices.detach()
    if values.dtype not in (torch.float32, torch.float64):
        values = values.float()
    length, width = values.shape[-2], values.shape[-1]
    if keep is None:
        counts = torch.full((values.shape[0],), length, device=values.device)
    else:
        keep = keep.to(device=values.device, dtype=torch.bool)
        values = values * keep[..., None].to(values.dtype)
        counts = keep.sum(dim=1)
    singular = singular_values(values, method)  # [B, min(T, d)], descending
    ranks = counts.clamp(min=1, max=min(length, width)) - 1
    smallest = singular.gather(1, ranks[:, None].long()).squeeze(1)
    smallest = torch.where(counts > 0, smallest, torch.zeros_like(smallest))
    return smallest, singular[:, 0]


def condition_number(sigma_min: torch.Tensor, sigma_max: torch.Tensor) -> torch.Tensor:
    """sigma_max / sigma_min, with ``inf`` where sigma_min is 0."""
    return torch.where(
        sigma_min > 0, sigma_max / sigma_min.clamp(min=torch.finfo(sigma_min.dtype).tiny), torch.inf
    )


@dataclass(frozen=True)
class AttentionSpectra:
    """Singular values of one forward pass; every tensor is ``[L, B]`` (layer, example).

    Attributes:
        layer_names: the L attention modules.
        sigma_min, sigma_max, condition: of Attn(X).
        residual_sigma_min, residual_sigma_max, residual_condition: of beta * X + Attn(X).
        betas: the residual coefficient used per layer.
    """

    layer_names: tuple[str, ...]
    sigma_min: torch.Tensor
    sigma_max: torch.Tensor
    condition: torch.Tensor
    residual_sigma_min: torch.Tensor
    residual_sigma_max: torch.Tensor
    residual_condition: torch.Tensor
    betas: tuple[float, ...]

    def layer_means(self) -> list[dict[str, Any]]:
        """One row per layer: the mean over examples of each quantity (condition: median)."""
        rows = []
        for index, name in enumerate(self.layer_names):
            rows.append(
                {
                    "layer": name,
                    "beta": self.betas[index],
                    "sigma_min": float(self.sigma_min[index].mean()),
                    "sigma_max": float(self.sigma_max[index].mean()),
                    "condition_median": float(self.condition[index].median()),
                    "residual_sigma_min": float(self.residual_sigma_min[index].mean()),
                    "residual_sigma_max": float(self.residual_sigma_max[index].mean()),
                    "residual_condition_median": float(self.residual_condition[index].median()),
                }
            )
        return rows


def _spectra_of(attention_output: torch.Tensor, residual: torch.Tensor, keep: Any) -> list:
    low, high = singular_value_extremes(attention_output, keep)
    residual_low, residual_high = singular_value_extremes(residual, keep)
    return [low, high, residual_low, residual_high]


@dataclass
class _Pending:
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    results: dict[int, list[torch.Tensor]] = field(default_factory=dict)


class SpectraRecorder:
    """Forward hooks that record attention-output spectra every ``every`` forward passes.

    Example:
        >>> with SpectraRecorder(model, every=10) as recorder:
        ...     for step in range(100):
        ...         train_step(model)            # forwards 0, 10, 20, ... are measured
        >>> recorder.records[-1].sigma_min       # [L, B]

    The padding mask is read from the ``attention_mask`` argument of the model's own forward.
    Values are computed on detached tensors under ``torch.no_grad``; a measured forward pass
    costs two batched eigendecompositions of ``[B, min(T, d), min(T, d)]`` Gram matrices per
    layer; the other passes cost a counter.

    Args:
        model: our Transformer, an HFEncoder or a Hugging Face BERT-family model.
        every: measure forward passes 0, every, 2 * every, ...
        beta: the residual coefficient for beta * X + Attn(X); ``None`` uses each layer's own.
        on_record: optional callback ``(forward_index, spectra)`` called after each measurement.
        keep_records: keep every measurement in ``records`` (turn off for long runs with
            ``on_record``).
    """

    def __init__(
        self,
        model: nn.Module,
        every: int = 1,
        beta: float | None = None,
        on_record: Callable[[int, AttentionSpectra], None] | None = None,
        keep_records: bool = True,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r} is out of range; it must be an integer >= 1.")
        if beta is not None and not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta={beta} is out of range; allowed range is [0, 1].")
        self.model = model
        self.every = every
        self.sites = find_attention_sites(model)
        self.betas = tuple(site.beta if beta is None else float(beta) for site in self.sites)
        self.on_record = on_record
        self.keep_records = keep_records
        self.records: list[tuple[int, AttentionSpectra]] = []
        self.forward_count = 0
        self._active = False
        self._keep: torch.Tensor | None = None
        self._pending = _Pending()
        self._handles: list[Any] = []
        self._signature = inspect.signature(model.forward)

    # -- hooks ---------------------------------------------------------------------------
    def _before_model(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._active = self.forward_count % self.every == 0
        self.forward_count += 1
        if not self._active:
            return
        mask = kwargs.get("attention_mask")
        if mask is None and args:
            try:
                mask = self._signature.bind_partial(*args, **kwargs).arguments.get("attention_mask")
            except TypeError:
                mask = None
        self._keep = None if mask is None else mask.detach() != 0
        self._pending = _Pending()

    def _after_model(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not self._active:
            return
        self._active = False
        pending = self._pending
        if len(pending.results) != len(self.sites):
            return  # a partial pass (e.g. an exception inside); nothing to record
        stacked = [
            torch.stack([pending.results[i][k] for i in range(len(self.sites))]) for k in range(4)
        ]
        spectra = AttentionSpectra(
            layer_names=tuple(site.name for site in self.sites),
            sigma_min=stacked[0],
            sigma_max=stacked[1],
            condition=condition_number(stacked[0], stacked[1]),
            residual_sigma_min=stacked[2],
            residual_sigma_max=stacked[3],
            residual_condition=condition_number(stacked[2], stacked[3]),
            betas=self.betas,
        )
        index = self.forward_count - 1
        if self.keep_records:
            self.records.append((index, spectra))
        if self.on_record is not None:
            self.on_record(index, spectra)

    def _input_hook(self, position: int) -> Callable[..., None]:
        site = self.sites[position]

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._active:
                return
            value = kwargs.get(site.input_keyword)
            if value is None and len(args) > site.input_position:
                value = args[site.input_position]
            if isinstance(value, torch.Tensor):
                self._pending.inputs[position] = value.detach()

        return hook

    def _output_hook(self, position: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if not self._active:
                return
            attention = output[0] if isinstance(output, tuple | list) else output
            inputs = self._pending.inputs.pop(position, None)
            if inputs is None or not isinstance(attention, torch.Tensor):
                return
            with torch.no_grad():
                attention = attention.detach()
                keep = self._keep
                if keep is not None and keep.shape != attention.shape[:2]:
                    keep = None  # e.g. trimmed or packed inputs: measure every row
                residual = self.betas[position] * inputs.to(attention.dtype) + attention
                self._pending.results[position] = _spectra_of(attention, residual, keep)

        return hook

    # -- lifecycle -----------------------------------------------------------------------
    def attach(self) -> SpectraRecorder:
        """Register the hooks (done by ``with``); returns self."""
        if self._handles:
            return self
        self._handles.append(
            self.model.register_forward_pre_hook(self._before_model, with_kwargs=True)
        )
        self._handles.append(self.model.register_forward_hook(self._after_model, with_kwargs=True))
        for position, site in enumerate(self.sites):
            self._handles.append(
                site.input_module.register_forward_pre_hook(
                    self._input_hook(position), with_kwargs=True
                )
            )
            self._handles.append(
                site.output_module.register_forward_hook(self._output_hook(position))
            )
        return self

    def detach(self) -> None:
        """Remove every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> SpectraRecorder:
        return self.attach()

    def __exit__(self, *exc_info: object) -> None:
        self.detach()


def attention_spectra(
    model: nn.Module, batch: dict[str, torch.Tensor], beta: float | None = None
) -> AttentionSpectra:
    """Attention-output spectra of one forward pass on ``batch`` (labels are ignored).

    The model's train/eval mode is left as it is (so dropout, if on, is part of the
    measurement); the pass runs under ``torch.no_grad``.

    Args:
        model: our Transformer, an HFEncoder or a Hugging Face BERT-family model.
        batch: model inputs (``input_ids``/``inputs``, ``attention_mask``), labels optional.
        beta: the residual coefficient for beta * X + Attn(X); ``None`` uses each layer's own.
    """
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with SpectraRecorder(model, every=1, beta=beta) as recorder, torch.no_grad():
        model(**inputs)
    if not recorder.records:
        raise RuntimeError(
            f"the forward pass of {type(model).__name__} did not pass through every attention "
            f"module ({len(recorder.sites)} found); nothing was recorded"
        )
    return recorder.records[-1][1]
