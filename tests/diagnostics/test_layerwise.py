from __future__ import annotations

import pytest
import torch

from convergent.diagnostics import layerwise_losses, monotonicity_report
from convergent.losses import task_loss
from convergent.models import Transformer, TransformerConfig


def test_last_layer_loss_equals_the_model_loss():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(num_outputs=3, input_dim=5, max_len=7, n_layers=3))
    batch = {"inputs": torch.randn(4, 7, 5), "labels": torch.tensor([0, 1, 2, 1])}
    losses = layerwise_losses(model, batch)
    assert losses.shape == (4,)
    expected = task_loss(model(inputs=batch["inputs"]).logits, batch["labels"], "classification")
    torch.testing.assert_close(losses[-1], expected)
    losses.sum().backward()
    assert model.blocks[0].attention.q_proj.weight.grad is not None


def test_monotonicity_report():
    report = monotonicity_report([1.0, 0.8, 0.9, 0.5])
    assert report.satisfied == (True, False, True)
    assert report.fraction_satisfied == pytest.approx(2 / 3)
    assert not report.is_monotone
    assert report.largest_increase == pytest.approx(0.1)
    strict = monotonicity_report([1.0, 0.8, 0.5], alpha=0.25)
    assert strict.satisfied == (False, True)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\), got 1.0"):
        monotonicity_report([1.0, 0.5], alpha=1.0)
    with pytest.raises(ValueError, match="one per layer"):
        monotonicity_report([1.0, 0.5, 0.4], alpha=[0.1])
