"""Paired comparisons of two classifiers over test sentences and seeds, and how finely they
resolve a margin (STUDIES.md rule 9).

:func:`correct_per_example` marks which test sentences a model gets right; two models' marks
on the same sentences, one row per training seed, make a seeds x sentences table of paired
differences. A difference has two sources of variance: which training seed ran (both models of
a seed share it) and which sentences the test set holds. Write D_is = (method correct -
baseline correct) on sentence i of N in seed s of n, in {-1, 0, 1}, and model it as crossed
random effects, D_is = mu + a_i + b_s + e_is (a sentence's own effect, a seed's own effect, and
the rest). The effect is the mean of D, with Var(mean D) = var_a / N + var_b / n + var_e / (N n).

- The seed-level t-interval over d_s = mean_i D_is estimates var_b + var_e / N from n values:
  it holds the test set fixed and misses var_a / N.
- The paired t-interval over sentences, over m_i = mean_s D_is, estimates var_a + var_e / n
  from N values: it holds the trained models fixed and misses var_b / n, the shift a whole
  seed gives every sentence at once.
- :func:`crossed_interval` covers both: from the mean squares of the two-way table
  (MS_seeds, MS_sentences, MS_residual), Var(mean D) = (MS_sentences + MS_seeds -
  MS_residual) / (N n) with Satterthwaite's degrees of freedom. Where a variance component's
  estimate comes out below zero it is not cut to zero (that would drop a term five seeds
  cannot rule out): the conservative (MS_sentences + MS_seeds) / (N n) is used instead, its
  degrees of freedom over the two terms kept. The seeds' mean square always stays in the sum,
  so with 5 seeds the degrees of freedom fall toward n - 1 as MS_seeds' share grows, and reach
  the sentences' only where the seeds' share is truly negligible.

The *resolution* of a margin is the expected half-width of the interval: a claim "at most M
below" cannot be reproduced at a true difference of 0 when the half-width exceeds M.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import nn

from convergent.data import DictDataset
from convergent.studies.framework.claims import Claim
from convergent.train import split_batch


@torch.no_grad()
def correct_per_example(model: nn.Module, dataset: DictDataset, batch_size: int = 256) -> str:
    """Which examples ``model`` classifies correctly, in the dataset's order: one character
    per example, ``"1"`` (the arg-max class is the label) or ``"0"``.

    The share of ``"1"`` is ``evaluate``'s accuracy on the same dataset; kept per example, two
    models scored on the same dataset can be compared sentence by sentence.
    """
    was_training = model.training
    model.eval()
    marks: list[str] = []
    size = len(dataset)
    for start in range(0, size, batch_size):
        batch = {key: value[start : start + batch_size] for key, value in dataset.tensors.items()}
        mask = batch.get("attention_mask")
        if mask is not None:  # the all-padding tail changes no prediction: cut it
            longest = max(int(mask.sum(dim=1).max()), 1)
            batch = {
                key: value[:, :longest] if value.shape[:2] == mask.shape else value
                for key, value in batch.items()
            }
        inputs, labels = split_batch(batch)
        hits = model(**inputs).logits.argmax(dim=-1) == labels
        marks.extend("1" if hit else "0" for hit in hits.tolist())
    model.train(was_training)
    return "".join(marks)


CONFIDENCE = 0.95
MOST_SEEDS = 100_000  # seeds_to_resolve gives up beyond this


@dataclass(frozen=True)
class CrossedInterval:
    """The 95 % interval of a mean over a seeds x sentences table, and the one-way half-widths.

    Attributes:
        mean: the mean of the table (the mean of the per-seed means).
        low, high: the interval over seeds and sentences together.
        degrees_of_freedom: Satterthwaite's, for the t quantile of ``low`` and ``high``.
        seeds_half_width: the seed-level t-interval's half-width (test set held fixed).
        sentences_half_width: the paired t-interval over sentences' half-width (trained models
            held fixed).
    """

    mean: float
    low: float
    high: float
    degrees_of_freedom: float
    seeds_half_width: float
    sentences_half_width: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def mark_differences(
    pairs: Iterable[tuple[Any, Sequence[Any] | None, Sequence[Any] | None]],
    baseline: str,
    method: str,
    where: str = "",
) -> list[list[int]]:
    """The seeds x sentences table of paired differences, method correct minus baseline correct
    (-1, 0 or 1), from ``(seed, baseline marks, method marks)`` per seed (the marks of
    :func:`correct_per_example`, as booleans or 0/1); a seed where either has no marks (a
    diverged run, or data from before the marks were stored) is left out.

    Raises:
        ValueError: marks of different lengths (not the same test sentences), naming the seed,
            ``baseline``, ``method`` and ``where`` (" at ..." : what was scored).
    """
    rows = []
    for seed, first, second in pairs:
        if first is None or second is None:
            continue
        if len(first) != len(second):
            raise ValueError(
                f"seed {seed}: {baseline} marked {len(first)} test sentences and {method} "
                f"{len(second)}{where}; they must be the same sentences"
            )
        rows.append([int(b) - int(a) for a, b in zip(first, second, strict=True)])
    return rows


def seed_half_width(per_seed: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """t_(0.975, n-1) x SD(per_seed) / sqrt(n): the seed-level interval's half-width (NaN below
    2 finite values)."""
    finite = [float(v) for v in per_seed if math.isfinite(v)]
    if len(finite) < 2:
        return math.nan
    quantile = float(stats.t.ppf(0.5 + confidence / 2, len(finite) - 1))
    return quantile * statistics.stdev(finite) / math.sqrt(len(finite))


def seeds_to_resolve(spread: float, margin: float, confidence: float = CONFIDENCE) -> int | None:
    """The fewest seeds n >= 2 with t_(0.975, n-1) x ``spread`` / sqrt(n) <= ``margin``: how
    many seeds the seed-level interval needs for its expected half-width to reach the margin at
    a per-seed SD of ``spread``; None when more than :data:`MOST_SEEDS` (or not finite)."""
    if not (math.isfinite(spread) and margin > 0):
        return None
    quantile = 0.5 + confidence / 2
    # t > z, so the z-based count is a lower bound to start from.
    seeds = max(2, math.ceil((float(stats.norm.ppf(quantile)) * spread / margin) ** 2))
    while seeds <= MOST_SEEDS:
        if float(stats.t.ppf(quantile, seeds - 1)) * spread / math.sqrt(seeds) <= margin:
            return seeds
        seeds += 1
    return None


def crossed_interval(
    differences: Sequence[Sequence[float]], confidence: float = CONFIDENCE
) -> CrossedInterval | None:
    """The interval of the mean of a seeds x sentences table of paired differences, over
    seeds and sentences together (the module docstring has the model).

    Args:
        differences: one row per seed, one column per test sentence (the same sentences in
            every row, in the same order).
        confidence: the coverage, 0.95 by default.

    Returns:
        The interval, or None below 2 seeds or 2 sentences.

    Raises:
        ValueError: rows of different lengths.
    """
    if len({len(row) for row in differences}) > 1:
        raise ValueError("every seed's row must hold the same test sentences")
    table = np.asarray(differences, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 2 or table.shape[1] < 2:
        return None
    seeds, sentences = table.shape
    grand = float(table.mean())
    seed_means, sentence_means = table.mean(axis=1), table.mean(axis=0)
    ms_seeds = sentences * float(((seed_means - grand) ** 2).sum()) / (seeds - 1)
    ms_sentences = seeds * float(((sentence_means - grand) ** 2).sum()) / (sentences - 1)
    residual = table - seed_means[:, None] - sentence_means[None, :] + grand
    ms_residual = float((residual**2).sum()) / ((seeds - 1) * (sentences - 1))
    # Every variance term is kept. Where a component's estimate comes out below zero (five
    # seeds estimate a variance poorly), the residual's negative coefficient is dropped
    # instead: E[MS_sentences + MS_seeds] exceeds (N n) Var(mean D) by var_e, so the interval is
    # conservative, and the seeds' term keeps its own few degrees of freedom in Satterthwaite's
    # sum. Cutting the component at zero instead lets the degrees of freedom jump from the
    # seeds' to the sentences' on a noisy estimate (docs/studies.md, "a variance that cannot be
    # ruled out is kept").
    both_positive = ms_sentences >= ms_residual and ms_seeds >= ms_residual
    terms = [
        (1.0, ms_sentences, sentences - 1),
        (1.0, ms_seeds, seeds - 1),
        (-1.0 if both_positive else 0.0, ms_residual, (seeds - 1) * (sentences - 1)),
    ]
    total = sum(weight * square for weight, square, _ in terms)
    denominator = sum((weight * square) ** 2 / df for weight, square, df in terms)
    freedom = total**2 / denominator if denominator > 0 else math.inf
    quantile = 0.5 + confidence / 2
    half = (
        float(stats.t.ppf(quantile, freedom)) * math.sqrt(total / (seeds * sentences))
        if total > 0
        else 0.0
    )
    spread = float(np.std(sentence_means, ddof=1))
    return CrossedInterval(
        mean=grand,
        low=grand - half,
        high=grand + half,
        degrees_of_freedom=freedom,
        seeds_half_width=seed_half_width(seed_means.tolist(), confidence),
        sentences_half_width=float(stats.t.ppf(quantile, sentences - 1))
        * spread
        / math.sqrt(sentences),
    )


def with_crossed(claim: Claim, crossed: CrossedInterval | None, method: str) -> Claim:
    """``claim`` with the two-way interval ``crossed`` (its bounds, ``method`` as the interval's
    description, Satterthwaite's degrees of freedom); unchanged where there is none."""
    if crossed is None:
        return claim
    return dataclasses.replace(
        claim,
        interval=(crossed.low, crossed.high),
        interval_method=method,
        degrees_of_freedom=crossed.degrees_of_freedom,
    )


def margin_resolution(
    per_seed: Sequence[float], crossed: CrossedInterval | None, sentences: int | None, margin: float
) -> dict[str, Any]:
    """How finely a paired difference resolves ``margin``: the interval's half-width (the
    two-way ``crossed`` one over ``sentences`` test sentences where there is one, else the
    seed-level one of ``per_seed``), the one-way half-widths, the per-seed SD and the seeds the
    seed-level interval would need (JSON-ready, for a claim's ``extra``)."""
    finite = [v for v in per_seed if math.isfinite(v)]
    spread = statistics.stdev(finite) if len(finite) > 1 else math.nan
    seed_level = seed_half_width(finite)
    half = crossed.half_width if crossed is not None else seed_level
    return {
        "margin": margin,
        "half_width": half,
        "resolvable": bool(half <= margin) if math.isfinite(half) else None,
        "seed_half_width": seed_level,
        "sentence_half_width": None if crossed is None else crossed.sentences_half_width,
        "degrees_of_freedom": None if crossed is None else crossed.degrees_of_freedom,
        "per_seed_sd": spread,
        "seeds_needed": seeds_to_resolve(spread, margin),
        "sentences": sentences,
        "interval": None if crossed is None else [crossed.low, crossed.high],
    }
