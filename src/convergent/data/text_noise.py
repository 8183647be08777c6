"""Text perturbations at a rate: typing errors and missing words, applied to raw strings.

These are realistic test-time shifts for text classifiers, applied before tokenization, so
a model trained on clean sentences is scored on the same sentences as a hurried typist or a
lossy transcript would give them:

- ``"typos"``: each letter (``str.isalpha``) is edited, independently with probability
  ``rate``, by one edit drawn uniformly from swap-with-the-next-letter, drop, insert a
  random lowercase letter after it, replace by a random lowercase letter. Non-letters are
  never edited, so word boundaries, digits and punctuation survive.
- ``"word_dropout"``: the text is split on whitespace and each word is dropped
  independently with probability ``rate``; a sentence keeps at least its first word.

``perturb_texts`` applies one kind to many texts with a single seeded generator, so two
models evaluated at the same (kind, rate, seed) see identical perturbed inputs.
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Sequence

TEXT_PERTURBATIONS = ("typos", "word_dropout")

_EDITS = ("swap", "drop", "insert", "replace")


def _check_rate(rate: float) -> None:
    if not (math.isfinite(rate) and 0 <= rate <= 1):
        raise ValueError(f"rate is {rate}; it must be a finite probability in [0, 1]")


def typo_text(text: str, rate: float, generator: random.Random) -> str:
    """``text`` with character-level typos: each letter edited with probability ``rate``.

    An edited letter gets one edit chosen uniformly among: swap with the next character
    (only when that is a letter too; otherwise the edit becomes a drop), drop, insert a
    random lowercase ascii letter after it, replace by a random lowercase ascii letter. The
    expected fraction of letters touched is ``rate``; a swapped pair counts as two touched
    letters and its partner is not edited again. Spaces, digits and punctuation are kept.

    Args:
        text: the clean text.
        rate: the probability that a letter is edited, in [0, 1]; 0 returns ``text``.
        generator: the random source, consumed in reading order.

    Returns:
        The text with typos.
    """
    _check_rate(rate)
    if rate == 0:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        character = text[index]
        index += 1
        if not character.isalpha() or generator.random() >= rate:
            out.append(character)
            continue
        edit = generator.choice(_EDITS)
        if edit == "swap" and index < len(text) and text[index].isalpha():
            out += [text[index], character]
            index += 1  # the partner moved with this edit; it is not edited again
        elif edit == "insert":
            out += [character, generator.choice(string.ascii_lowercase)]
        elif edit == "replace":
            out.append(generator.choice(string.ascii_lowercase))
        # a drop, or a swap without a letter to swap with, leaves the letter out
    return "".join(out)


def word_dropout(text: str, rate: float, generator: random.Random) -> str:
    """``text`` with each whitespace-separated word dropped with probability ``rate``.

    The kept words are joined by single spaces. If every word would be dropped the first
    one is kept, so a sentence never becomes empty (a text without words stays empty).

    Args:
        text: the clean text.
        rate: the probability that a word is dropped, in [0, 1]; 0 only normalizes the
            whitespace, giving ``" ".join(text.split())``.
        generator: the random source, one draw per word in reading order.

    Returns:
        The kept words, in order, separated by single spaces.
    """
    _check_rate(rate)
    words = text.split()
    if rate == 0:
        return " ".join(words)
    kept = [word for word in words if generator.random() >= rate]
    return " ".join(kept or words[:1])


def perturb_texts(texts: Sequence[str], kind: str, rate: float, seed: int) -> list[str]:
    """Every text of ``texts`` perturbed by ``kind`` at ``rate``, reproducibly.

    One ``random.Random(seed)`` is consumed text after text, so the same (texts, kind,
    rate, seed) always gives the same list, and equal texts get independent perturbations.

    Args:
        texts: the clean texts.
        kind: ``"typos"`` or ``"word_dropout"`` (see the module docstring).
        rate: the per-letter or per-word probability, in [0, 1].
        seed: the seed of the generator.

    Returns:
        The perturbed texts, in the order of ``texts``.
    """
    if kind not in TEXT_PERTURBATIONS:
        raise ValueError(
            f"perturbation must be one of {', '.join(TEXT_PERTURBATIONS)}, got {kind!r}"
        )
    _check_rate(rate)
    perturb = typo_text if kind == "typos" else word_dropout
    generator = random.Random(seed)
    return [perturb(text, rate, generator) for text in texts]
