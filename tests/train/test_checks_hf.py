"""The manipulation checks inside transformers.Trainer: MethodChecksCallback for a plain
optimizer, and the checks SparsityCallback and DescentTrainer run themselves."""

from __future__ import annotations

import logging

import pytest

from convergent.optim import HORST, Langevin
from convergent.sparse import ACDCSchedule
from tests.constrained.tiny_bert import tiny_bert_descent
from tests.train.test_sparsity_callback_hf import tiny_bert, token_data

transformers = pytest.importorskip("transformers")
from convergent.train.checks_hf import MethodChecksCallback  # noqa: E402
from convergent.train.primal_dual import descent_step  # noqa: E402
from convergent.train.primal_dual_hf import DescentTrainer  # noqa: E402
from convergent.train.sparse_hf import SparsityCallback  # noqa: E402


def _args(tmp_path, steps: int = 20):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=steps,
        logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip


def _warnings(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "warning" in entry]


def _train(tmp_path, optimizer_for, callbacks, steps=20):
    model = tiny_bert()
    trainer = transformers.Trainer(
        model=model, args=_args(tmp_path, steps), train_dataset=token_data(),
        optimizers=(optimizer_for(model), None), callbacks=callbacks,
    )  # fmt: skip
    trainer.train()
    return trainer


def test_a_plain_trainer_with_horst_at_alpha_1_gets_one_warning_in_its_history(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="convergent.train.checks"):
        trainer = _train(tmp_path, lambda m: HORST(m.parameters(), lr=1e-3, alpha=1.0),
                         [MethodChecksCallback()])  # fmt: skip
    warnings = _warnings(trainer)
    assert [entry["check"] for entry in warnings] == ["mirror_acts"]
    assert warnings[0]["value"] < 0.2 and "acting as AdamW" in warnings[0]["warning"]
    assert len(caplog.records) == 1
    ratios = [e["mirror_move_ratio"] for e in trainer.state.log_history if "mirror_move_ratio" in e]
    assert ratios and max(ratios) < 0.2  # the readings join the training logs


def test_a_plain_trainer_with_default_horst_gets_none(tmp_path):
    trainer = _train(tmp_path, lambda m: HORST(m.parameters(), lr=1e-3), [MethodChecksCallback()])
    assert _warnings(trainer) == []


def test_a_cold_langevin_in_a_trainer_warns_that_its_noise_does_nothing(tmp_path):
    trainer = _train(tmp_path, lambda m: Langevin(m.parameters(), lr=1e-2, s=1e-14, seed=0),
                     [MethodChecksCallback()])  # fmt: skip
    assert [entry["check"] for entry in _warnings(trainer)] == ["noise_acts"]


def test_sparsity_callback_warns_when_its_schedule_outlasts_the_run(tmp_path):
    callback = SparsityCallback(0.8, schedule=ACDCSchedule(total_steps=400))
    trainer = _train(tmp_path, lambda m: HORST(m.parameters(), lr=1e-3), [callback])
    assert [entry["check"] for entry in _warnings(trainer)] == ["sparsity_reached"]
    callback = SparsityCallback(0.8)  # AC/DC over the run's own 20 steps
    trainer = _train(tmp_path / "fitting", lambda m: HORST(m.parameters(), lr=1e-3), [callback])
    assert _warnings(trainer) == []


def test_descent_trainer_warns_when_its_constraints_never_bind(tmp_path):
    model, data, step = tiny_bert_descent(16)
    slack = descent_step("classification", 2, alpha=0.0, dual_lr=1e-6)
    slack.readout = step.readout
    trainer = DescentTrainer(model=model, args=_args(tmp_path, 12), train_dataset=data,
                             descent=slack)  # fmt: skip
    trainer.train()
    assert "constraints_bind" in {entry["check"] for entry in _warnings(trainer)}


def test_sparsity_callback_runs_gradual_magnitude_pruning(tmp_path):
    from convergent.sparse import GradualSchedule

    schedule = GradualSchedule(0.8, start_step=2, end_step=12, frequency=2)
    callback = SparsityCallback(0.8, schedule=schedule)
    trainer = _train(tmp_path, lambda m: HORST(m.parameters(), lr=1e-3), [callback], steps=16)
    assert _warnings(trainer) == []  # the check: 80 % at the end
    assert callback.masked.achieved_sparsity(trainer.model) == pytest.approx(0.8, abs=1e-3)
    assert callback.masked.compressions == 6  # one mask per update, t = 2, 4, ..., 12
