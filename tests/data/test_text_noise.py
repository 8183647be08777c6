"""Typos and word dropout: rates checked against binomial bounds, edits against their rules.

Expected values come from the definitions, not from the functions: a single-letter word can
only become "" (drop, or a swap with no letter after it), the letter plus one lowercase
letter (insert) or one lowercase letter (replace), so each token shows which edit it got.
"""

from __future__ import annotations

import math
import random
import re
import string

import pytest
from scipy.stats import binom

from convergent.data import TEXT_PERTURBATIONS, perturb_texts, typo_text, word_dropout

LETTERS = string.ascii_lowercase
CONFIDENCE = 1 - 1e-6  # a fixed seed already makes these exact; the bound keeps them honest


def _within_binomial(count: int, trials: int, probability: float) -> bool:
    low, high = binom.interval(CONFIDENCE, trials, probability)
    return low <= count <= high


def _single_letter_words(count: int) -> list[str]:
    return [LETTERS[index % 26] for index in range(count)]


def test_rate_zero_is_the_identity_for_typos_and_whitespace_normalization_for_dropout():
    text = "  The film's  pacing,\tat 2 hours, drags.\n"
    assert typo_text(text, 0.0, random.Random(0)) == text
    assert word_dropout(text, 0.0, random.Random(0)) == "The film's pacing, at 2 hours, drags."
    assert perturb_texts([text, "a  b"], "typos", 0.0, seed=1) == [text, "a  b"]
    assert perturb_texts([text, "a  b"], "word_dropout", 0, seed=1) == [
        "The film's pacing, at 2 hours, drags.",
        "a b",
    ]


def test_typos_at_rate_one_edit_every_letter_by_one_of_the_four_edits():
    words = _single_letter_words(20_000)
    tokens = typo_text(" ".join(words), 1.0, random.Random(2)).split(" ")
    assert len(tokens) == len(words)  # spaces are never edited
    dropped = inserted = replaced = unchanged = 0
    for word, token in zip(words, tokens, strict=True):
        if token == "":
            dropped += 1
        elif len(token) == 2:
            assert token[0] == word and token[1] in LETTERS
            inserted += 1
        else:
            assert len(token) == 1 and token in LETTERS
            replaced += 1
            unchanged += token == word
    n = len(words)
    # a swap has no letter to swap with here, so it falls back to a drop: 1/4 + 1/4
    assert _within_binomial(dropped, n, 1 / 2)
    assert _within_binomial(inserted, n, 1 / 4)
    assert _within_binomial(replaced, n, 1 / 4)
    # only a replacement by the same letter (1/4 * 1/26) leaves a letter as it was
    assert _within_binomial(unchanged, n, 1 / 104)


def test_a_swapped_pair_is_not_edited_again():
    n = 20_000
    tokens = typo_text(" ".join(["ab"] * n), 1.0, random.Random(3)).split(" ")
    assert len(tokens) == n
    # "ba" arises from a swap (1/4); or drop 'a' then insert 'a' after 'b' (1/4 * 1/4 * 1/26);
    # or replace 'a' by 'b' then replace 'b' by 'a' (1/4 * 1/26 * 1/4 * 1/26). Were the
    # partner edited again at rate 1, a swap would almost never survive as "ba".
    swapped = 1 / 4 + 1 / (16 * 26) + 1 / (16 * 26 * 26)
    assert _within_binomial(tokens.count("ba"), n, swapped)


def test_typos_never_edit_non_letters():
    symbols = "0123 456, 789! -- (42) ... ?? 3.14 ;: @#$ %^&*  \t\n"
    assert typo_text(symbols, 1.0, random.Random(4)) == symbols
    mixed = "Hello, world! It's 2024: 3 films, 1 flop.  Ça va?" * 50
    for rate in (0.5, 1.0):
        noisy = typo_text(mixed, rate, random.Random(5))
        assert [c for c in noisy if not c.isalpha()] == [c for c in mixed if not c.isalpha()]


def test_typos_touch_a_rate_fraction_of_letters():
    n = 40_000
    tokens = typo_text(" ".join(["x"] * n), 0.1, random.Random(6)).split(" ")
    assert len(tokens) == n
    changed = sum(token != "x" for token in tokens)
    # an edit is invisible only when it replaces 'x' by 'x': probability 1/4 * 1/26
    assert _within_binomial(changed, n, 0.1 * (1 - 1 / 104))
    assert not _within_binomial(changed, n, 0.12)  # the bound can tell 0.1 from 0.12


def test_typos_edit_every_letter_of_a_long_word_independently():
    n = 10_000
    tokens = typo_text(" ".join(["abcdefgh"] * n), 0.1, random.Random(14)).split(" ")
    assert len(tokens) == n
    # with distinct neighbours, a word survives only if each of its 8 letters is left alone
    # or replaced by itself: probability (0.9 + 0.1 / 104) ** 8
    survived = tokens.count("abcdefgh")
    assert _within_binomial(survived, n, (0.9 + 0.1 / 104) ** 8)


def test_word_dropout_drops_a_rate_fraction_of_words_and_keeps_the_order():
    words = [f"w{index}" for index in range(20_000)]
    kept = word_dropout("\n ".join(words), 0.3, random.Random(7)).split(" ")
    positions = [int(word[1:]) for word in kept]
    assert positions == sorted(set(positions))  # a subsequence, in order, no repeats
    assert _within_binomial(len(words) - len(kept), len(words), 0.3)


def test_word_dropout_at_rate_one_keeps_exactly_the_first_word():
    assert word_dropout("  the quick\tbrown fox ", 1.0, random.Random(8)) == "the"
    assert perturb_texts(["one two", "three"], "word_dropout", 1.0, seed=0) == ["one", "three"]


def test_word_dropout_never_returns_an_empty_sentence():
    sentences = [f"s{index} is short" for index in range(2000)]
    noisy = perturb_texts(sentences, "word_dropout", 0.9, seed=9)
    assert all(noisy)
    # the first word alone: every word dropped (0.9 ** 3, then the first is kept back) or
    # only the first kept (0.1 * 0.9 ** 2)
    first_alone = sum(out == clean.split()[0] for clean, out in zip(sentences, noisy, strict=True))
    assert _within_binomial(first_alone, len(sentences), 0.9**3 + 0.1 * 0.9**2)
    assert word_dropout(" \t", 0.5, random.Random(0)) == ""  # no word to keep


@pytest.mark.parametrize("kind", TEXT_PERTURBATIONS)
def test_perturb_texts_is_reproducible_and_depends_on_the_seed(kind):
    texts = [f"review {index}: a slow, moving and honest film" for index in range(200)]
    first = perturb_texts(texts, kind, 0.2, seed=10)
    assert perturb_texts(texts, kind, 0.2, seed=10) == first
    assert perturb_texts(texts, kind, 0.2, seed=11) != first
    assert first != texts


@pytest.mark.parametrize("kind", TEXT_PERTURBATIONS)
def test_perturb_texts_perturbs_equal_texts_independently(kind):
    texts = ["a slow, moving and honest film about two brothers"] * 50
    assert len(set(perturb_texts(texts, kind, 0.5, seed=12))) > 10


def test_perturb_texts_consumes_one_generator_in_text_order():
    texts = ["the plot thickens", "nothing happens", "a fine cast, wasted"]
    generator = random.Random(13)
    expected = [typo_text(text, 0.4, generator) for text in texts]
    assert perturb_texts(texts, "typos", 0.4, seed=13) == expected


def test_an_unknown_kind_is_rejected_with_the_allowed_kinds():
    message = "perturbation must be one of typos, word_dropout, got 'xyz'"
    with pytest.raises(ValueError, match=re.escape(message)):
        perturb_texts(["text"], "xyz", 0.1, seed=0)


@pytest.mark.parametrize("rate", [-0.1, 1.5, math.nan, math.inf])
def test_a_rate_outside_zero_one_is_rejected_naming_the_value(rate):
    pattern = re.escape(str(rate)) + r".*\[0, 1\]"
    with pytest.raises(ValueError, match=pattern):
        typo_text("text", rate, random.Random(0))
    with pytest.raises(ValueError, match=pattern):
        word_dropout("text", rate, random.Random(0))
    for kind in TEXT_PERTURBATIONS:
        with pytest.raises(ValueError, match=pattern):
            perturb_texts(["text"], kind, rate, seed=0)
