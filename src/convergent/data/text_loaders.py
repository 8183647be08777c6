"""Splits of the text sources: subword-tokenized sentences and character-level novels.

Token inputs are "input_ids" (and "attention_mask" for padded text), targets "labels".
``token_classification_splits`` is shared with the ``hf:`` sources of ``hub.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from convergent.data.parsers import load_austen, load_rt_sentences
from convergent.data.sources import minilm_path
from convergent.data.splits import DictDataset, Splits, random_split_indices, split_counts


def default_tokenizer() -> Any:
    """The uncased WordPiece tokenizer of the ``minilm-l6`` source, loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


def tokenize(texts: Sequence[str], tokenizer: Any, max_length: int) -> dict[str, torch.Tensor]:
    """Tokenize, truncate and pad every text to exactly ``max_length`` tokens.

    Returns:
        {"input_ids": long [N, max_length], "attention_mask": long [N, max_length]}.
    """
    if max_length < 2:
        raise ValueError(f"max_length {max_length} is too short; it must be at least 2.")
    encoded = tokenizer(
        list(texts),
        padding="max_length",
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return {
        "input_ids": encoded["input_ids"].long(),
        "attention_mask": encoded["attention_mask"].long(),
    }


def token_classification_splits(
    texts: Sequence[str],
    labels: torch.Tensor,
    seed: int,
    tokenizer: Any | None,
    max_length: int,
    num_classes: int,
    indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> Splits:
    """Tokenized texts with class labels, split at ``indices`` (train, validation, test)
    or, by default, 80/10/10 at random with ``seed``."""
    tokenizer = default_tokenizer() if tokenizer is None else tokenizer
    dataset = DictDataset({**tokenize(texts, tokenizer, max_length), "labels": labels.long()})
    if indices is None:
        indices = random_split_indices(len(dataset), seed)
    train, validation, test = indices
    return Splits(
        train=dataset.subset(train),
        validation=dataset.subset(validation),
        test=dataset.subset(test),
        task="classification",
        num_outputs=num_classes,
        seq_len=max_length,
        vocab_size=len(tokenizer),
        info={"indices": {"train": train, "validation": validation, "test": test}},
    )


def rt_sentences_splits(seed: int = 0, tokenizer: Any = None, max_length: int = 64) -> Splits:
    """Binary sentiment of the Rotten Tomatoes sentences: label 1 if the mean human score is
    positive, 0 if negative. The 37 sentences scored exactly 0 have no sign and are left
    out (10,568 remain). ``info["indices"]`` index into ``load_rt_sentences()``."""
    texts, scores = load_rt_sentences()
    signed = torch.nonzero(scores != 0).squeeze(1)
    splits = token_classification_splits(
        [texts[i] for i in signed.tolist()],
        (scores[signed] > 0).long(),
        seed,
        tokenizer,
        max_length,
        num_classes=2,
    )
    splits.info["indices"] = {key: signed[value] for key, value in splits.info["indices"].items()}
    splits.info["dropped_neutral"] = int((scores == 0).sum())
    return splits


# The character language model's split of every novel, by position: train, validation, test.
AUSTEN_FRACTIONS = (0.9, 0.05, 0.05)
UNKNOWN_CHARACTER = "\ufffd"


def austen_splits(seed: int = 0, seq_len: int = 128) -> Splits:
    """Character-level language modelling on Jane Austen's six novels.

    Each novel is cut by position: its first 90 % of characters go to train, the next 5 % to
    validation and the last 5 % to test, so no passage is in two splits. Every block is cut
    into non-overlapping windows of ``seq_len`` + 1 characters (a remainder shorter than
    that is dropped, and no window crosses a block): "input_ids" are the first ``seq_len``
    characters, "labels" the same shifted by one (the next characters). The vocabulary is
    the sorted set of characters of the training blocks (80 ASCII characters, newline
    included), plus U+FFFD as a last entry when validation or test hold a character that is
    not in it, which then maps there: here "£", found only near the end of Mansfield Park,
    so the vocabulary has 81 entries. ``info`` keeps the vocabulary ("itos"), the
    character range of each split in each novel ("char_ranges": split -> title -> (start,
    stop)) and each window's origin ("window_starts": split -> long [N, 2] of (novel index,
    offset)). The seed is accepted for a uniform interface but changes nothing.
    """
    del seed
    books = load_austen()
    split_names = ("train", "validation", "test")
    char_ranges: dict[str, dict[str, tuple[int, int]]] = {name: {} for name in split_names}
    for title, text in books.items():
        train_count, validation_count, _ = split_counts(len(text), AUSTEN_FRACTIONS)
        bounds = (0, train_count, train_count + validation_count, len(text))
        for name, start, stop in zip(split_names, bounds[:-1], bounds[1:], strict=True):
            char_ranges[name][title] = (start, stop)
    shortest = min(
        stop - start for ranges in char_ranges.values() for start, stop in ranges.values()
    )
    if not 1 <= seq_len < shortest:
        raise ValueError(
            f"seq_len {seq_len} is out of range; it must be in [1, {shortest - 1}] (the "
            "shortest block of a novel)."
        )
    itos = sorted({c for title, (a, b) in char_ranges["train"].items() for c in books[title][a:b]})
    unknown = sorted(
        {
            c
            for name in split_names[1:]
            for title, (a, b) in char_ranges[name].items()
            for c in books[title][a:b]
        }
        - set(itos)
    )
    if unknown:
        itos.append(UNKNOWN_CHARACTER)
    largest_code = max(ord(max(text)) for text in [*books.values(), "".join(itos)])
    lookup = np.full(largest_code + 1, len(itos) - 1, dtype=np.int64)
    lookup[[ord(character) for character in itos]] = np.arange(len(itos))
    datasets, window_starts = {}, {}
    for name in split_names:
        inputs, labels, starts = [], [], []
        for book_index, (title, (start, stop)) in enumerate(char_ranges[name].items()):
            codes = np.frombuffer(books[title][start:stop].encode("utf-32-le"), dtype=np.uint32)
            ids = torch.from_numpy(lookup[codes])
            offsets = torch.arange(0, len(ids) - seq_len, seq_len)
            windows = ids[offsets[:, None] + torch.arange(seq_len + 1)]
            inputs.append(windows[:, :-1])
            labels.append(windows[:, 1:])
            starts.append(torch.stack([torch.full_like(offsets, book_index), offsets + start], 1))
        datasets[name] = DictDataset({"input_ids": torch.cat(inputs), "labels": torch.cat(labels)})
        window_starts[name] = torch.cat(starts)
    return Splits(
        train=datasets["train"],
        validation=datasets["validation"],
        test=datasets["test"],
        task="lm",
        num_outputs=len(itos),
        seq_len=seq_len,
        vocab_size=len(itos),
        info={
            "itos": itos,
            "books": list(books),
            "char_ranges": char_ranges,
            "window_starts": window_starts,
            "unknown_characters": unknown,
        },
    )
