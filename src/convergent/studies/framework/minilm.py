"""The pretrained model the studies fine-tune: MiniLM-L6 with a fresh classification head."""

from __future__ import annotations

from typing import Any

from convergent.data import minilm_path
from convergent.models import HFEncoder
from convergent.train import seed_everything


def minilm_classifier(seed: int, layers: int | None = None) -> HFEncoder:
    """MiniLM-L6 (or its first ``layers`` layers) with a fresh mean-pooled 2-class head, drawn
    from ``seed``, in training mode."""
    from transformers.utils import logging as hf_logging

    seed_everything(seed)
    options: dict[str, Any] = {} if layers is None else {"num_hidden_layers": layers}
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # a cut model's unused layers are expected, not news
    hf_logging.disable_progress_bar()  # one bar per run of a study is noise
    try:
        model = HFEncoder.from_pretrained(
            minilm_path(), num_outputs=2, pooling="mean", attn_implementation="sdpa", **options
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    return model.train()
