"""Hugging Face model folders (what ``save_pretrained`` writes): detect, load, measure.

A folder is a Hugging Face model folder when its ``config.json`` names a ``model_type`` and
a weights file (``model.safetensors``, ``pytorch_model.bin`` or a sharded index) sits beside
it, and it is not one of our run folders (those hold ``checkpoints/`` and a ``TrainConfig``).
The model is loaded offline (``local_files_only=True``) as a causal LM when the config's
``architectures`` name one (``...ForCausalLM``, ``...LMHeadModel``), as a sequence classifier
for ``...ForSequenceClassification``, with the tokenizer saved in the same folder.

Evaluation data is the validation split of a named source, tokenized with that tokenizer:
a classifier is scored on a token source's labels (``rt-sentences``, ``hf:NAME``); a causal
LM on the next token of the same texts, or of Austen's validation windows decoded back to
text (``austen``).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convergent.commands.sentence_embeddings import SENTENCE_EMBEDDING
from convergent.data import DictDataset, is_token_source, load_splits, tokenize
from convergent.losses import next_token_labels
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
# The data each kind is measured on when the user names none.
DEFAULT_DATA = {
    CAUSAL_LM: "austen",
    SEQUENCE_CLASSIFICATION: "rt-sentences",
    SENTENCE_EMBEDDING: "rt-sentences",
}
DATA_CHOICES = {
    CAUSAL_LM: "austen, rt-sentences or hf:NAME",
    SEQUENCE_CLASSIFICATION: "rt-sentences or hf:NAME",
    SENTENCE_EMBEDDING: "rt-sentences or hf:NAME",
}
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
# English runs about four characters per subword token, so an Austen window of this many
# characters per token of max_length fills the window after tokenization.
CHARACTERS_PER_TOKEN = 4
# Logits entries per evaluation batch (64 MB in fp32): a language model's logits are
# [B, T, vocabulary], which at GPT-2's 50k vocabulary is the memory that matters.
LOGITS_PER_BATCH = 2**24


# The task each kind is scored as, and the metric a task leads with.
TASKS = {
    CAUSAL_LM: "lm",
    SEQUENCE_CLASSIFICATION: "classification",
    SENTENCE_EMBEDDING: "embedding",
}
METRIC_OF_TASK = {"lm": "perplexity", "classification": "accuracy", "embedding": "embedding_cosine"}


class HFFolderError(ValueError):
    """A Hugging Face model folder that cannot be used as asked."""


def _read_config(path: Path) -> dict[str, Any] | None:
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
    config = _read_config(folder)
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
    config = _read_config(folder)
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
    config = _read_config(folder)
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
                " prune it without --low-memory"
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


def evaluation_tokenizer(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` that pads on the right with a pad token (GPT-2's has none;
    its end-of-text token stands in). The folder's own tokenizer is left as saved."""
    padded = copy.deepcopy(tokenizer)
    padded.padding_side = "right"  # next-token labels and positions assume real tokens first
    if padded.pad_token is None:
        stand_in = padded.eos_token or padded.unk_token
        if stand_in is None:
            raise HFFolderError(
                "the tokenizer has no pad, end-of-text or unknown token to pad batches with"
            )
        padded.pad_token = stand_in
    return padded


@dataclass
class EvaluationData:
    """Validation examples of a named source, ready for the model.

    Attributes:
        dataset: ``input_ids``, ``attention_mask`` and ``labels``.
        task: ``"lm"`` or ``"classification"`` (as in :mod:`convergent.losses`), or
            ``"embedding"`` (a sentence encoder: inputs only, no labels).
        data: the source name.
        max_length: tokens per example.
    """

    dataset: DictDataset
    task: str
    data: str
    max_length: int


SPLITS = ("train", "validation")


def _austen_texts(seed: int, max_length: int, examples: int | None, split: str) -> list[str]:
    """Austen's windows of ``split``, decoded from character ids back to text."""
    splits = load_splits("austen", seed=seed, seq_len=CHARACTERS_PER_TOKEN * max_length)
    itos = splits.info["itos"]
    windows = getattr(splits, split).tensors["input_ids"][:examples]
    return ["".join(itos[index] for index in row) for row in windows.tolist()]


def evaluation_data(
    loaded: HFModel,
    data_name: str,
    *,
    seed: int = 0,
    max_length: int = 64,
    examples: int | None = None,
    split: str = "validation",
) -> EvaluationData:
    """The validation (or train) split of ``data_name``, tokenized with the folder's tokenizer.

    Args:
        loaded: the model folder.
        data_name: ``austen`` or a token source (``rt-sentences``, ``hf:NAME``) for a
            causal LM; a token source whose classes match the classifier for a classifier.
        seed: the split seed.
        max_length: tokens per example (truncated and padded to it).
        examples: keep only the first this many examples (None: all).
        split: ``"validation"`` (to measure on) or ``"train"`` (e.g. pruning's calibration
            batches, which must not be the examples the pruned model is measured on).

    Returns:
        An :class:`EvaluationData`.

    Raises:
        HFFolderError: data the model cannot be measured on, or a length past its positions.
    """
    if examples is not None and examples < 1:
        raise HFFolderError(f"{option('examples', examples)} is out of range; it must be >= 1.")
    if split not in SPLITS:
        raise HFFolderError(f"split={split!r} is not one of {SPLITS}")
    positions = getattr(loaded.model.config, "max_position_embeddings", None)
    if max_length < 2 or (positions is not None and max_length > positions):
        allowed = f"in [2, {positions}] (the model's positions)" if positions else "at least 2"
        raise HFFolderError(
            f"{option('max_length', max_length)} is out of range; it must be {allowed}."
        )
    tokenizer = evaluation_tokenizer(loaded.tokenizer)
    if loaded.kind == CAUSAL_LM and data_name == "austen":
        encoded = tokenize(_austen_texts(seed, max_length, examples, split), tokenizer, max_length)
    elif is_token_source(data_name):
        splits = load_splits(data_name, seed=seed, tokenizer=tokenizer, max_length=max_length)
        tensors = getattr(splits, split).tensors
        encoded = {key: value[:examples] for key, value in tensors.items()}
        classes = getattr(loaded.model.config, "num_labels", None)
        if loaded.kind == SEQUENCE_CLASSIFICATION and splits.num_outputs != classes:
            raise HFFolderError(
                f"{option('data', data_name)} has {splits.num_outputs} classes but the classifier"
                " in "
                f"{loaded.path} has {classes}; choose data with {classes} classes"
            )
    else:
        raise HFFolderError(
            f"{option('data', data_name)} is not text a {loaded.kind} model can be measured on;"
            f" choose {DATA_CHOICES[loaded.kind]}"
        )
    if loaded.kind == CAUSAL_LM:
        encoded = {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": next_token_labels(encoded["input_ids"], encoded["attention_mask"]),
        }
    elif loaded.kind == SENTENCE_EMBEDDING:
        encoded = {key: encoded[key] for key in ("input_ids", "attention_mask")}
    task = TASKS[loaded.kind]
    return EvaluationData(DictDataset(encoded), task, data_name, max_length)


def evaluation_batch_size(loaded: HFModel, max_length: int) -> int:
    """Examples per evaluation batch: 64 for a classifier; for a causal LM as many as keep
    its ``[B, T, vocabulary]`` logits within ``LOGITS_PER_BATCH`` entries."""
    if loaded.kind != CAUSAL_LM:
        return 64
    vocabulary = int(loaded.model.get_output_embeddings().weight.shape[0])
    return max(1, min(64, LOGITS_PER_BATCH // (max_length * vocabulary)))


def evaluation_summary(
    path: str | Path, loaded: HFModel, evaluation: EvaluationData, max_length: int, seed: int
) -> dict[str, Any]:
    """The summary entries that say which folder was scored on what: the folder, its kind and
    architecture, the validation data, its size, and the metric its task is scored by."""
    return {
        "checkpoint": str(path),
        "kind": loaded.kind,
        "architecture": loaded.architecture,
        "data": evaluation.data,
        "split": "validation",
        "examples": len(evaluation.dataset),
        "max_length": max_length,
        "seed": seed,
        "task": evaluation.task,
        "metric": METRIC_OF_TASK[evaluation.task],
    }
