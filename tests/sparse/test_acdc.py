"""AC/DC: the schedule's phases, and MaskedStep following it inside fit (with exact resume)."""

from __future__ import annotations

import itertools

import pytest
import torch

from convergent.optim import HORST
from convergent.sparse import ACDCSchedule
from convergent.train import ErmStep, fit
from convergent.train.masked import MaskedStep
from tests.conftest import make_classification
from tests.sparse.test_enforce import ThreeLayers, _names


def test_default_schedule_is_the_imagenet_recipe_in_steps():
    schedule = ACDCSchedule(100)
    assert schedule.describe() == (
        "D[0,10) C[10,15) D[15,20) C[20,25) D[25,30) C[30,35) D[35,40) C[40,45) D[45,50)"
        " C[50,55) D[55,60) C[60,65) D[65,70) C[70,75) D[75,85) C[85,100)"
    )
    assert schedule.compressions == 8
    assert [schedule.is_compressed(i) for i in (0, 9, 10, 14, 15, 84, 85, 99, 150)] == [
        False, False, True, True, False, False, True, True, True,
    ]  # fmt: skip


@pytest.mark.parametrize("total", [1, 2, 7, 13, 40, 333])
def test_schedule_covers_every_step_and_ends_compressed(total):
    phases = ACDCSchedule(total).phases
    assert phases[0].start == 0 and phases[-1].stop == total
    assert all(
        a.stop == b.start and a.compressed != b.compressed for a, b in itertools.pairwise(phases)
    )
    assert phases[-1].compressed


def test_schedule_rejects_fractions_over_one():
    with pytest.raises(ValueError, match="at most 1"):
        ACDCSchedule(
            100, warmup_fraction=0.5, final_dense_fraction=0.3, final_compressed_fraction=0.3
        )
    with pytest.raises(ValueError, match="total_steps must be an integer >= 1, got 0"):
        ACDCSchedule(0)


class Recorder:
    def __init__(self) -> None:
        self.compressed: list[bool] = []

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        self.compressed.append(bool(metrics["compressed"]))


def _acdc_run(steps: int, run_dir=None, resume=False, stop=None):
    torch.manual_seed(0)
    model = ThreeLayers()
    optimizer = HORST(model.parameters(), lr=2e-2, weight_decay=0.05)
    schedule = ACDCSchedule(steps)
    masked = MaskedStep(ErmStep("classification"), optimizer, _names(model), sparsity=0.8,
                        schedule=schedule, reset="moments")  # fmt: skip
    recorder = Recorder()
    fit(model, optimizer, make_classification(), max_steps=stop or steps, batch_size=16,
        training_step=masked, progress=False, run_dir=run_dir, resume=resume,
        checkpoint_every=5 if run_dir else 0, callbacks=[recorder], tensorboard=False)  # fmt: skip
    return model, masked, recorder, schedule


def test_masked_step_follows_the_schedule_and_ends_exactly_sparse():
    model, masked, recorder, schedule = _acdc_run(40)
    # Step s's metrics say whether the *next* step (index s) runs compressed.
    assert recorder.compressed == [schedule.is_compressed(i) for i in range(1, 41)]
    assert masked.compressions == schedule.compressions
    parameters = dict(model.named_parameters())
    assert masked.masks is not None
    pruned = sum(int((parameters[name] == 0).sum()) for name in masked.names)
    assert pruned == round(0.8 * masked.masks.numel)


def test_resume_reproduces_the_trajectory(tmp_path):
    reference, *_ = _acdc_run(40)
    _acdc_run(40, run_dir=tmp_path, stop=17)  # checkpoints at 5, 10, 15 and 17 (mid-phase)
    resumed, masked, *_ = _acdc_run(40, run_dir=tmp_path, resume=True)
    assert masked.step == 40
    for (name, value), other in zip(
        reference.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(other, value, rtol=0, atol=0, msg=name)
