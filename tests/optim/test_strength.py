"""HORST's strength in user units: alpha x mean|theta| and the measured mirror/AdamW ratio."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from convergent.optim import HORST, horst_move_ratio, horst_strength
from convergent.train import HorstStrengthLog


def _stepped(alpha: float, size: float) -> HORST:
    generator = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (40, 30), generator=generator).double() * 2 - 1
    matrix = torch.nn.Parameter(signs * size)  # every |theta| equals size
    bias = torch.nn.Parameter(torch.full((30,), 0.5, dtype=torch.float64))
    optimizer = HORST(
        [{"params": [matrix]}, {"params": [bias]}], lr=1e-4, alpha=alpha, weight_decay=0.0
    )
    matrix.grad = torch.randn(40, 30, generator=generator, dtype=torch.float64)
    bias.grad = torch.randn(30, generator=generator, dtype=torch.float64)
    optimizer.step()
    return optimizer


def test_strength_is_alpha_times_the_mean_magnitude_of_the_mirrored_tensors():
    optimizer = _stepped(alpha=50.0, size=0.02)
    matrix_group, bias_group = horst_strength(optimizer)
    mean = float(optimizer.param_groups[0]["params"][0].detach().abs().mean())
    assert matrix_group["mean_abs"] == pytest.approx(mean, rel=1e-12)
    assert matrix_group["alpha_times_mean_abs"] == pytest.approx(50.0 * mean, rel=1e-12)
    assert matrix_group["mirrored"] == 1200
    assert math.isnan(bias_group["mean_abs"]) and bias_group["mirrored"] == 0  # ndim 1: no mirror


@pytest.mark.parametrize("alpha", [1.0, 20.0, 100.0])
def test_the_measured_ratio_matches_alpha_times_the_magnitude_when_all_are_equal(alpha):
    # With every |theta| = c, each element's mirror move is ~ alpha * c * |u| to first order,
    # so ||mirror|| / ||u|| = alpha * c (the bias group adds Adam move only: left out here).
    optimizer = _stepped(alpha=alpha, size=0.02)
    optimizer.param_groups[1]["lr"] = 0.0  # the bias would add AdamW move without mirror
    ratio = horst_move_ratio(optimizer)
    matrix = optimizer.param_groups[0]["params"][0].detach()
    assert ratio == pytest.approx(alpha * float(matrix.abs().mean()), rel=0.02)


def test_the_log_callback_writes_one_line_per_evaluation_and_at_the_end(caplog):
    optimizer = _stepped(alpha=20.0, size=0.02)
    log = HorstStrengthLog(optimizer)
    with caplog.at_level(logging.INFO, logger="convergent.train.callbacks"):
        log.on_evaluate(10, {})
        log.on_fit_end(SimpleNamespace(step=10))  # already logged at this step
        log.on_fit_end(SimpleNamespace(step=12))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("step 10: HORST mirror/AdamW move ratio")
    assert [step for step, _, _ in log.records] == [10, 12]
    assert log.records[0][2][0] == pytest.approx(
        horst_strength(optimizer)[0]["alpha_times_mean_abs"]
    )
