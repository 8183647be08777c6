"""The pretrained model the studies fine-tune, MiniLM-L6 with a fresh classification head, and
the sentences they fine-tune it on: rt-sentences in MiniLM's tokens."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from convergent.data import DictDataset, load_splits, minilm_path
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


@dataclass(frozen=True)
class RtSentences:
    """rt-sentences in MiniLM's tokens (the library's seeded split, seed 0).

    Attributes:
        train: the training split, cut to its first examples.
        validation, test: the evaluation splits, each cut to its first examples, then ordered
            by length (stable), so evaluation batches carry little padding (about a third less
            compute); accuracies are sums over sentences and per-sentence marks keep this
            order, the same in every run.
        test_indices: each test row's index in ``load_rt_sentences()``'s texts.
        tokenizer: MiniLM's tokenizer.
    """

    train: DictDataset
    validation: DictDataset
    test: DictDataset
    test_indices: list[int]
    tokenizer: Any


@functools.lru_cache(maxsize=2)
def rt_sentences(
    max_length: int,
    train: int | None = None,
    validation: int | None = None,
    test: int | None = None,
) -> RtSentences:
    """rt-sentences for MiniLM, each split cut to its first ``train`` / ``validation`` /
    ``test`` sentences (all where None), loaded once per process."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    splits = load_splits("rt-sentences", seed=0, tokenizer=tokenizer, max_length=max_length)

    def cut(dataset: DictDataset, count: int | None) -> DictDataset:
        if count is None or count >= len(dataset):
            return dataset
        return dataset.subset(torch.arange(count))

    def by_length(dataset: DictDataset) -> torch.Tensor:
        return torch.argsort(dataset.tensors["attention_mask"].sum(1), stable=True)

    validation_set, test_set = cut(splits.validation, validation), cut(splits.test, test)
    test_order = by_length(test_set)
    indices = splits.info["indices"]["test"][: len(test_set)][test_order].tolist()
    return RtSentences(
        train=cut(splits.train, train),
        validation=validation_set.subset(by_length(validation_set)),
        test=test_set.subset(test_order),
        test_indices=indices,
        tokenizer=tokenizer,
    )
