"""``from_pretrained`` on a compressed folder: transformers' quantizer interface, for our format.

    import convergent                      # registers the quantizer (lazily: see registration.py)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("runs/gpt2-pruned")      # == load_sparse, bitwise
    fast = AutoModelForCausalLM.from_pretrained(
        "runs/gpt2-pruned", quantization_config=SparseFormatConfig(kernels=True)
    )                                       # pruned layers on sparse kernels where faster

A compressed folder's ``config.json`` carries ``quantization_config = {"quant_method":
"convergent-sparse", "weights": "sparse_model.safetensors"}``. transformers picks the
quantizer registered under that ``quant_method``, which

1. points transformers at the compressed file (``config.transformers_weights``), before it
   looks for ``model.safetensors``;
2. lets transformers load the tensors stored dense under their own names, and tells it that
   the compressed ones (``NAME#mask``, ``NAME#values``, ...) are ours, so it reports no
   missing or unexpected keys;
3. after transformers' loading, decodes every tensor of the folder into the model with
   :func:`~convergent.sparse.storage.load_compressed_into` (checksums first, bit for bit), and
   with ``kernels=True`` runs :func:`~convergent.sparse.kernels.to_sparse_kernels`.

Without ``kernels`` the model is then an ordinary dense model (the quantization config is
removed, as transformers does for ``dequantize``): ``Trainer``, PEFT, ``save_pretrained`` and
pipelines take it as they take any model. Without convergent installed, transformers warns
"Unknown quantization type, got convergent-sparse" and raises its ``OSError`` for the
missing ``model.safetensors``, rather than loading random weights.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from convergent.sparse.storage import (
    COMPRESSED_WEIGHTS,
    FORMAT_VERSION,
    PART_SEPARATOR,
    QUANT_METHOD,
    compressed_files,
    load_compressed_into,
    read_header,
)


class SparseFormatConfig(QuantizationConfigMixin):
    """The ``quantization_config`` of a compressed folder, and the options of loading it.

    Args:
        weights: the compressed weights file (or shard index) beside ``config.json``.
        version: the format version written.
        kernels: after loading, put each pruned linear layer on a sparse kernel where a
            timing on this machine shows it faster (inference only).
        tokens: the rows per forward that the kernels are timed at (1 for token-by-token
            generation).
    """

    def __init__(
        self,
        weights: str = COMPRESSED_WEIGHTS,
        version: int = FORMAT_VERSION,
        kernels: bool = False,
        tokens: int = 1,
        **kwargs: Any,
    ) -> None:
        self.quant_method = QUANT_METHOD  # type: ignore[assignment]
        self.weights = weights
        self.version = version
        self.kernels = kernels
        self.tokens = tokens
        if tokens < 1:
            raise ValueError(f"tokens={tokens} is out of range; it must be >= 1")

    @property
    def dequantize(self) -> bool:
        """Without kernels the loaded model is an ordinary dense one (transformers then drops
        the quantization config from it)."""
        return not self.kernels

    def get_loading_attributes(self) -> dict[str, Any]:
        """The options a ``from_pretrained(quantization_config=...)`` may change."""
        return {"kernels": self.kernels, "tokens": self.tokens}


class SparseFormatQuantizer(HfQuantizer):
    """Loads a compressed folder bit for bit (see the module docstring)."""

    requires_calibration = True  # reads compressed folders only; it compresses nothing

    def __init__(self, quantization_config: QuantizationConfigMixin, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self.folder: Path | None = None

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        # Called again with the resolved map once device_map="auto" is placed.
        _refuse_offload(kwargs.get("device_map"))

    def update_attn_implementation(self, config: Any) -> Any:
        # The one hook that sees the config before transformers looks for the weights file.
        config.transformers_weights = self.quantization_config.weights  # type: ignore[attr-defined]
        return config

    def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        files = kwargs.get("checkpoint_files") or []
        if not files:
            raise ValueError("the convergent-sparse quantizer loads a compressed folder only")
        self.folder = Path(files[0]).parent
        compressed = [
            name
            for file in compressed_files(self.folder)
            for name, entry in read_header(file)["tensors"].items()
            if entry.get("kind") != "dense"
        ]
        # transformers reads the dense-stored tensors; the others are ours (decoded below).
        model._keys_to_ignore_on_load_unexpected = {
            *(model._keys_to_ignore_on_load_unexpected or ()),
            re.escape(PART_SEPARATOR),
        }
        if compressed:
            model._keys_to_ignore_on_load_missing = {
                *(model._keys_to_ignore_on_load_missing or ()),
                "^(?:" + "|".join(re.escape(name) for name in compressed) + ")$",
            }
        return model

    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        if self.folder is None:
            raise ValueError("the convergent-sparse quantizer was not given the folder to load")
        if hasattr(model.config, "transformers_weights"):
            del model.config.transformers_weights  # a later save_pretrained writes its own files
        # transformers chose each tensor's dtype (the folder's, or the dtype asked for): keep it.
        chosen = {name: tensor.dtype for name, tensor in model.state_dict().items()}
        load_compressed_into(model, self.folder)
        for name, tensor in model.state_dict(keep_vars=True).items():
            if tensor.dtype != chosen[name]:
                tensor.data = tensor.data.to(chosen[name])
        model.eval()
        config = self.quantization_config
        if getattr(config, "kernels", False):
            from convergent.sparse.kernels import to_sparse_kernels

            to_sparse_kernels(model, tokens=int(getattr(config, "tokens", 1)))
        return model

    def is_serializable(self, **kwargs: Any) -> bool:
        return False  # a model on sparse kernels; without kernels the quantizer is removed

    @property
    def is_trainable(self) -> bool:
        return False


def _refuse_offload(device_map: Any) -> None:
    """A device map that offloads modules (to ``"disk"``, or to ``"cpu"`` beside an
    accelerator) leaves their parameters on the meta device, to be read from the checkpoint by
    their names: a compressed folder stores the pruned ones under other names, so refuse it
    in one sentence rather than fail later with a bare ``KeyError``."""
    if not isinstance(device_map, dict):
        return
    places = {str(place) for place in device_map.values()}
    offloaded = "disk" in places or ("cpu" in places and len(places - {"cpu", "disk"}) > 0)
    if offloaded:
        away = ("disk",) if "disk" in places else ("cpu",)
        moved = sorted(name or "the model" for name, place in device_map.items()
                       if str(place) in away)  # fmt: skip
        raise ValueError(
            f"device_map offloads {', '.join(moved[:3])}{' ...' * (len(moved) > 3)} to "
            f"{away[0]}, which a convergent-sparse folder does not support: give every module a "
            "device (device_map='cpu', 'cuda' or a map without 'disk'), or save the model "
            "dense first (convergent prune ... --dense)"
        )


def register_with_transformers() -> None:
    """Register :class:`SparseFormatConfig` and :class:`SparseFormatQuantizer` under
    ``QUANT_METHOD`` (once; a second call does nothing)."""
    from transformers.quantizers import auto

    if QUANT_METHOD not in auto.AUTO_QUANTIZATION_CONFIG_MAPPING:
        auto.register_quantization_config(QUANT_METHOD)(SparseFormatConfig)
    if QUANT_METHOD not in auto.AUTO_QUANTIZER_MAPPING:
        auto.register_quantizer(QUANT_METHOD)(SparseFormatQuantizer)
    # Loading options given to from_pretrained (kernels=True) override the folder's: the
    # merge honours them only for the config types listed here.
    listed = getattr(auto, "LOADING_ATTRIBUTES_CONFIG_TYPES", None)
    if isinstance(listed, tuple) and SparseFormatConfig not in listed:
        auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*listed, SparseFormatConfig)


__all__ = [
    "SparseFormatConfig",
    "SparseFormatQuantizer",
    "register_with_transformers",
]
