"""Hugging Face model folders (what ``save_pretrained`` writes): detect and load them.

A folder is a Hugging Face model folder when its ``config.json`` names a ``model_type`` and
a weights file (``model.safetensors``, ``pytorch_model.bin`` or a sharded index) sits beside
it, and it is not one of our run folders (those hold ``checkpoints/`` and a ``TrainConfig``).
The model is loaded offline (``local_files_only=True``) as a causal LM when the config's
``architectures`` name one (``...ForCausalLM``, ``...LMHeadModel``), as a sequence classifier
for ``...ForSequenceClassification``, with the tokenizer saved in the same folder. What such
a model is measured on is :mod:`convergent.commands.hf_folders`'.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convergent.commands.sentence_embeddings import SENTENCE_EMBEDDING
from convergent.losses.readout import CAUSAL_LM, SEQUENCE_CLASSIFICATION
from convergent.models.streamed import StreamedModel
from convergent.sparse.storage import (
    COMPRESSED_INDEX,
    COMPRESSED_WEIGHTS,
    has_compressed_weights,
    load_compressed_into,
    quantization_entry,
)
from convergent.wording import option

if TYPE_CHECKING:  # transformers is imported when a folder is loaded, not with the package
    from transformers import PreTrainedModel

HUGGING_FACE = "hugging-face"
RUN = "run"
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    COMPRESSED_WEIGHTS,  # written by save_sparse: transformers does not look for these
    COMPRESSED_INDEX,
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
)
# Our checkpoint folders also hold model.safetensors; these files tell them apart.
CHECKPOINT_MARKERS = ("state.pt", "manifest.json")


class HFFolderError(ValueError):
    """A Hugging Face model folder that cannot be used as asked."""


def read_config(path: Path) -> dict[str, Any] | None:
    """The folder's ``config.json`` as a dict (None: missing, unreadable or not an object)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None


def _has_weights(path: Path) -> bool:
    return any((path / name).is_file() for name in WEIGHT_FILES)


def is_hf_model_folder(path: str | Path) -> bool:
    """Whether ``path`` is a ``save_pretrained`` folder: ``config.json`` with a
    ``model_type``, a weights file beside it, and none of our run or checkpoint files."""
    folder = Path(path)
    if not folder.is_dir() or (folder / "checkpoints").is_dir():
        return False
    config = read_config(folder)
    return config is not None and "model_type" in config and _has_weights(folder)


def folder_kind(path: str | Path) -> str:
    """``"hugging-face"`` for a ``save_pretrained`` folder, else ``"run"`` (which
    :func:`~convergent.commands.runs.load_run` then accepts or explains).

    Raises:
        HFFolderError: a folder that is half a Hugging Face model folder: weights without
            ``config.json``, or a config naming a ``model_type`` without weights.
    """
    folder = Path(path)
    if is_hf_model_folder(folder):
        return HUGGING_FACE
    if not folder.is_dir() or any((folder / name).exists() for name in CHECKPOINT_MARKERS):
        return RUN
    config = read_config(folder)
    if config is None and _has_weights(folder) and not (folder / "config.json").exists():
        raise HFFolderError(
            f"{folder} holds model weights but no config.json; a Hugging Face model folder "
            "needs the config.json that save_pretrained writes"
        )
    if config is not None and "model_type" in config and not _has_weights(folder):
        raise HFFolderError(
            f"{folder} has a Hugging Face config.json but no weights; expected one of "
            f"{', '.join(WEIGHT_FILES)}"
        )
    return RUN


def architecture_kind(architectures: Sequence[str] | None) -> str:
    """``"causal-lm"``, ``"sequence-classification"`` or, for a model without a head (``BertModel``,
    a sentence-transformers folder), ``"sentence-embedding"``, for a config's ``architectures``.

    Raises:
        HFFolderError: when no listed architecture is one we load.
    """
    for name in architectures or ():
        if name.endswith(("ForCausalLM", "LMHeadModel")):
            return CAUSAL_LM
        if name.endswith("ForSequenceClassification"):
            return SEQUENCE_CLASSIFICATION
        if name.endswith("Model"):
            return SENTENCE_EMBEDDING
    raise HFFolderError(
        f"architectures {list(architectures or [])} are not supported; the config must name a "
        "causal LM (ending in ForCausalLM or LMHeadModel), a sequence classifier (ending in "
        "ForSequenceClassification) or a model without a head (ending in Model)"
    )


@dataclass
class HFModel:
    """A Hugging Face model loaded from a folder, with its tokenizer.

    Attributes:
        model: the model, in eval mode.
        tokenizer: the tokenizer saved in the same folder.
        kind: ``"causal-lm"``, ``"sequence-classification"`` or ``"sentence-embedding"``.
        architecture: the class name the config names, e.g. ``"GPT2LMHeadModel"``.
        path: the folder.
        streamed: the reader of a model loaded without its weights (else None).
    """

    model: PreTrainedModel
    tokenizer: Any
    kind: str
    architecture: str
    path: Path
    streamed: StreamedModel | None = None


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Hide ``transformers``' loading and saving progress bars inside the block: on stderr
    they would break the one-line error the command line promises."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__


def load_hf_folder(path: str | Path, dtype: Any = None, streamed: bool = False) -> HFModel:
    """Load the model and tokenizer of a ``save_pretrained`` folder, offline.

    Args:
        path: the folder.
        dtype: the model's dtype (None: the folder's own, as ``from_pretrained``).
        streamed: build the model without reading its weights (every parameter on the
            ``meta`` device), as a :class:`~convergent.models.streamed.StreamedModel` that reads
            them one block at a time (``HFModel.streamed``).

    Returns:
        An :class:`HFModel`.

    Raises:
        HFFolderError: no ``config.json``, an unsupported architecture, no tokenizer, or
            files that ``transformers`` cannot read.
    """
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    folder = Path(path)
    config = read_config(folder)
    if config is None:
        raise HFFolderError(
            f"{folder} has no readable config.json; pass a folder written by save_pretrained"
        )
    kind = architecture_kind(config.get("architectures"))
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise HFFolderError(
            f"{folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save one there "
            "with tokenizer.save_pretrained"
        )
    auto = {
        CAUSAL_LM: AutoModelForCausalLM,
        SEQUENCE_CLASSIFICATION: AutoModelForSequenceClassification,
        SENTENCE_EMBEDDING: AutoModel,
    }[kind]
    try:
        compressed = has_compressed_weights(folder)
        if compressed and streamed:
            raise HFFolderError(
                f"{folder} holds compressed weights, which low-memory pruning does not stream;"
                f" prune it with {option('low_memory', False)}"
            )
        with quiet_progress():
            reader = StreamedModel(folder, auto, dtype) if streamed else None
            if reader is not None:
                model = reader.model
            elif compressed:
                model = hf_model_from_compressed(folder, auto, dtype)
            else:
                model = auto.from_pretrained(folder, local_files_only=True, dtype=dtype)
    except (OSError, ValueError, KeyError) as error:
        raise HFFolderError(f"cannot load the model in {folder}: {_first_line(error)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise HFFolderError(
            f"cannot load the tokenizer in {folder}: {_first_line(error)}"
        ) from None
    model.eval()
    architecture = type(model).__name__
    return HFModel(model, tokenizer, kind, architecture, folder, reader)  # type: ignore[arg-type]


def hf_model_from_compressed(
    folder: str | Path, model_class: Any = None, dtype: Any = None
) -> PreTrainedModel:
    """The model of a folder that ``save_sparse`` wrote: built from its ``config.json`` and
    loaded bit for bit from its compressed weights (checksums verified first).

    Args:
        folder: the folder.
        model_class: a ``transformers`` class with ``from_config`` (an ``Auto...`` class or
            a model class); None: the class the config's ``architectures`` names.
        dtype: cast the loaded model to this dtype (None: each tensor's stored dtype).

    Raises:
        CompressedFileError: a damaged weights file, or weights that do not fit the config.
        HFFolderError: a config that names no class ``transformers`` has.
    """
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the model in memory is dense: save_pretrained writes it so
    if model_class is None:
        names = list(getattr(config, "architectures", None) or [])
        model_class = getattr(transformers, names[0], None) if names else None
        if model_class is None:
            raise HFFolderError(
                f"{folder}/config.json names no architecture transformers has ({names}); "
                "load it with load_sparse(folder, model_class=...)"
            )
    build = getattr(model_class, "from_config", None)  # Auto classes; model classes take config
    model = build(config) if build is not None else model_class(config)
    load_compressed_into(model, folder)
    if dtype is not None:
        model.to(dtype)
    return model.eval()


def save_compressed_config(
    config: Any, folder: str | Path, weights: str = COMPRESSED_WEIGHTS
) -> None:
    """Write a compressed folder's ``config.json``: the model's config with the
    ``quantization_config`` that names our format, so that ``from_pretrained`` finds the
    reader ``import convergent`` registers (``config`` itself is left as it was).

    Args:
        config: the model's ``transformers`` config.
        folder: where to write.
        weights: the compressed weights file, or ``COMPRESSED_INDEX`` for shards.
    """
    had = "quantization_config" in vars(config)
    before = vars(config).get("quantization_config")
    config.quantization_config = quantization_entry(weights)
    try:
        config.save_pretrained(folder)
    finally:
        if had:
            config.quantization_config = before
        else:
            del config.quantization_config
