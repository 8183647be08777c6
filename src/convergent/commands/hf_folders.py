"""Hugging Face model folders: what they are measured on.

Evaluation data is the validation split of a named source, tokenized with the folder's
tokenizer: a classifier is scored on a token source's labels (``rt-sentences``, ``hf:NAME``);
a causal LM on the next token of the same texts, or of Austen's validation windows decoded
back to text (``austen``). Detecting and loading a folder is
:mod:`convergent.commands.hf_reading`'s; its names are also importable from here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convergent.commands.hf_reading import (
    CHECKPOINT_MARKERS,
    HUGGING_FACE,
    RUN,
    TOKENIZER_FILES,
    WEIGHT_FILES,
    HFFolderError,
    HFModel,
    architecture_kind,
    folder_kind,
    hf_model_from_compressed,
    is_hf_model_folder,
    load_hf_folder,
    quiet_progress,
    save_compressed_config,
)
from convergent.commands.sentence_embeddings import SENTENCE_EMBEDDING
from convergent.data import DictDataset, is_token_source, load_splits, tokenize
from convergent.losses import next_token_labels
from convergent.losses.readout import CAUSAL_LM, SEQUENCE_CLASSIFICATION
from convergent.wording import option

__all__ = [  # the folder-reading names, for the callers that import them from here
    "CHECKPOINT_MARKERS",
    "HUGGING_FACE",
    "RUN",
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "EvaluationData",
    "HFFolderError",
    "HFModel",
    "architecture_kind",
    "evaluation_batch_size",
    "evaluation_data",
    "evaluation_summary",
    "evaluation_tokenizer",
    "folder_kind",
    "hf_model_from_compressed",
    "is_hf_model_folder",
    "load_hf_folder",
    "quiet_progress",
    "save_compressed_config",
]

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
        # copies, not views: a view would hold the whole tokenized split for the run
        encoded = {key: value[:examples].clone() for key, value in tensors.items()}
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
