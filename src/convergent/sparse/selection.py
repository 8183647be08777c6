"""Which parameters may be pruned: weight matrices, minus the exclusions the caller asks for.

Biases and normalization weights are never pruned (every tensor with ``ndim < 2`` and every
parameter of a normalization module). Embeddings, the first layer and the last layer can
be included (by default they are not: see :class:`~convergent.sparse.MaskSpec`). A weight shared between an embedding and an output
projection (tied input/output embeddings, as in GPT-2) counts as an embedding.

Works on plain ``nn.Module`` trees: our :class:`~convergent.models.Transformer`, ``transformers``
models (GPT-2's ``Conv1D`` stores its weight as ``[in, out]``, the transpose of ``nn.Linear``),
or anything else with ``nn.Linear`` / convolution layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from convergent.wording import option

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.modules.batchnorm._NormBase,
)


def is_conv1d(module: nn.Module) -> bool:
    """``transformers``' GPT-2 ``Conv1D`` (a linear layer with its weight stored ``[in, out]``)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def is_layer(module: nn.Module) -> bool:
    """A layer whose weight is a candidate for pruning: linear, convolution or ``Conv1D``."""
    return isinstance(module, nn.Linear | nn.modules.conv._ConvNd) or is_conv1d(module)


@dataclass
class Selection:
    """The prunable parameters of a model, and why every other weight was left out.

    Attributes:
        names: prunable parameter names, in the model's order (as ``named_parameters``).
        input_dims: for each prunable name, the dimension that indexes a layer's inputs
            (1 for ``nn.Linear`` and convolutions, 0 for ``Conv1D``); N:M groups run along it.
        excluded: every parameter with ``ndim >= 2`` that is not prunable -> the reason.
        tied: prunable or excluded names that other modules share -> the other names.
    """

    names: list[str] = field(default_factory=list)
    input_dims: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    tied: dict[str, list[str]] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per excluded weight matrix, for logs and reports."""
        lines = []
        for name, reason in self.excluded.items():
            shared = self.tied.get(name)
            also = f" (shared with {', '.join(shared)})" if shared else ""
            lines.append(f"{name}{also} is not pruned: {reason}")
        return lines


def select_prunable(
    model: nn.Module,
    *,
    include_embeddings: bool,
    include_first: bool,
    include_last: bool,
    exclude: tuple[str, ...],
) -> Selection:
    """Choose the parameters that masks will cover (the defaults are
    :class:`~convergent.sparse.MaskSpec`'s: call ``MaskSpec(...).select(model)``).

    Args:
        model: the (unwrapped) model.
        include_embeddings: also prune ``nn.Embedding`` weights (and weights tied to them).
        include_first: also prune the first layer (the first linear/convolution in module
            order, e.g. a patch projection).
        include_last: also prune the last layer (e.g. the classification head or LM head).
        exclude: substrings; a parameter whose name contains any of them is left out.

    Returns:
        The :class:`Selection`.
    """
    owners: dict[int, list[tuple[str, nn.Module]]] = {}
    for module_name, module in model.named_modules():
        for parameter_name, parameter in module.named_parameters(recurse=False):
            full = f"{module_name}.{parameter_name}" if module_name else parameter_name
            owners.setdefault(id(parameter), []).append((full, module))
    layer_weights = [
        id(module.weight)
        for _, module in model.named_modules()
        if is_layer(module) and isinstance(getattr(module, "weight", None), nn.Parameter)
    ]
    first = layer_weights[0] if layer_weights else None
    last = layer_weights[-1] if layer_weights else None
    selection = Selection()
    for name, parameter in model.named_parameters():
        if parameter.ndim < 2:
            continue  # biases, norm weights, scalars: never pruned, not worth a note
        holders = owners.get(id(parameter), [(name, model)])
        modules = [module for _, module in holders]
        others = [other for other, _ in holders if other != name]
        if others:
            selection.tied[name] = others
        reason = None
        if any(isinstance(module, NORM_TYPES) for module in modules):
            reason = "normalization weights are never pruned"
        elif any(isinstance(module, nn.Embedding) for module in modules):
            if not include_embeddings:
                what = "tied input/output embedding" if others else "embedding"
                reason = f"{what}; pass {option('include_embeddings', True)} to prune it"
        elif not any(is_layer(module) for module in modules):
            reason = "not the weight of a linear or convolution layer"
        elif id(parameter) == first and not include_first:
            reason = f"first layer; pass {option('include_first', True)} to prune it"
        elif id(parameter) == last and not include_last:
            reason = f"last layer; pass {option('include_last', True)} to prune it"
        if reason is None and any(pattern in name for pattern in exclude):
            reason = "excluded by name"
        if reason is not None:
            selection.excluded[name] = reason
            continue
        selection.names.append(name)
        selection.input_dims[name] = 0 if any(is_conv1d(module) for module in modules) else 1
    return selection
