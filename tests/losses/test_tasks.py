"""Known answers for the task losses and the evaluation scores, from formulas written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import log_softmax

from convergent.losses import summarize_scores, task_loss, task_scores


def _classification():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 4, generator=generator, dtype=torch.float64) * 3
    labels = torch.tensor([0, 1, 2, 3, 1, 1, 0])
    return logits, labels


def _lm():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 6, generator=generator, dtype=torch.float64) * 3
    labels = torch.randint(0, 6, (3, 5), generator=generator)
    labels[0, 3:] = -100
    labels[2, 1] = -100
    return logits, labels


def test_classification_scores_and_loss():
    logits, labels = _classification()
    log_p = log_softmax(logits.numpy(), axis=1)
    nll = -log_p[np.arange(7), labels.numpy()]
    correct = float((logits.numpy().argmax(axis=1) == labels.numpy()).sum())
    scores = task_scores(logits, labels, "classification")
    assert float(scores["loss_sum"]) == pytest.approx(nll.sum(), rel=1e-6)
    assert float(scores["count"]) == 7.0
    assert float(scores["correct"]) == correct
    metrics = summarize_scores(scores, "classification")
    assert metrics == pytest.approx({"loss": nll.mean(), "accuracy": correct / 7}, rel=1e-6)
    assert float(task_loss(logits, labels, "classification")) == pytest.approx(nll.mean(), rel=1e-6)
    per_example = task_loss(logits, labels, "classification", reduction="none")
    np.testing.assert_allclose(per_example.numpy(), nll, rtol=1e-6)


def test_regression_scores_and_loss():
    generator = torch.Generator().manual_seed(2)
    predictions = torch.randn(5, 3, 2, generator=generator, dtype=torch.float64)
    targets = torch.randn(5, 3, 2, generator=generator, dtype=torch.float64) + 0.5
    p, t = predictions.numpy(), targets.numpy()
    squared = (p - t) ** 2
    scores = task_scores(predictions, targets, "regression")
    expected = {
        "loss_sum": squared.reshape(5, -1).mean(axis=1).sum(),
        "count": 5.0,
        "squared_error_sum": squared.sum(),
        "target_squared_sum": (t**2).sum(),
        "element_count": 30.0,
    }
    assert {k: float(v) for k, v in scores.items()} == pytest.approx(expected, rel=1e-6)
    metrics = summarize_scores(scores, "regression")
    assert metrics == pytest.approx(
        {
            "loss": squared.mean(),
            "rmse": math.sqrt(squared.mean()),
            "relative_l2": math.sqrt(squared.sum() / (t**2).sum()),
        },
        rel=1e-6,
    )
    assert float(task_loss(predictions, targets, "regression")) == pytest.approx(squared.mean())
    assert float(task_loss(predictions, targets, "regression", "sum")) == pytest.approx(
        squared.sum()
    )
    np.testing.assert_allclose(
        task_loss(predictions, targets, "regression", reduction="none").numpy(),
        squared.reshape(5, -1).mean(axis=1),
        rtol=1e-6,
    )


def test_lm_scores_ignore_masked_positions():
    logits, labels = _lm()
    keep = labels.numpy() != -100
    log_p = log_softmax(logits.numpy(), axis=-1)
    safe = np.where(keep, labels.numpy(), 0)
    nll = -np.take_along_axis(log_p, safe[..., None], axis=-1)[..., 0]
    count = keep.sum()
    correct = float(((logits.numpy().argmax(axis=-1) == labels.numpy()) & keep).sum())
    scores = task_scores(logits, labels, "lm")
    assert float(scores["loss_sum"]) == pytest.approx(nll[keep].sum(), rel=1e-6)
    assert float(scores["count"]) == float(count) == 12.0  # 15 positions, 3 ignored
    assert float(scores["correct"]) == correct
    metrics = summarize_scores(scores, "lm")
    mean = nll[keep].mean()
    assert metrics == pytest.approx(
        {"loss": mean, "accuracy": correct / count, "perplexity": math.exp(mean)}, rel=1e-6
    )
    assert float(task_loss(logits, labels, "lm")) == pytest.approx(mean, rel=1e-6)


@pytest.mark.parametrize("task", ["classification", "regression", "lm"])
def test_scores_of_two_batches_add_up_to_the_whole(task):
    if task == "classification":
        logits, labels = _classification()
    elif task == "lm":
        logits, labels = _lm()
    else:
        generator = torch.Generator().manual_seed(3)
        logits = torch.randn(6, 4, generator=generator, dtype=torch.float64)
        labels = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    whole = summarize_scores(task_scores(logits, labels, task), task)
    first, second = (
        task_scores(logits[:2], labels[:2], task),
        task_scores(logits[2:], labels[2:], task),
    )
    added = summarize_scores({k: first[k] + second[k] for k in first}, task)
    assert added == pytest.approx(whole, rel=1e-6)  # the scores are summed in float32


def test_an_empty_total_reads_as_zero_not_a_division_error():
    zeros = {k: torch.zeros(()) for k in ("loss_sum", "count", "correct")}
    assert summarize_scores(zeros, "classification") == {"loss": 0.0, "accuracy": 0.0}


def test_unknown_task_is_named():
    logits, labels = _classification()
    with pytest.raises(ValueError, match="task must be one of classification, regression, lm"):
        task_scores(logits, labels, "ranking")
