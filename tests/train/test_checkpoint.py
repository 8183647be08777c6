from __future__ import annotations

import pytest
import torch

from convergent.train import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint
from convergent.train import checkpoint as checkpoint_module
from tests.conftest import TinyClassifier


def _state(step: int) -> dict:
    return {"step": step, "optimizer": {"lr": 0.1, "moments": torch.arange(3.0)}}


def test_round_trip_with_weights_only(tmp_path):
    model = TinyClassifier()
    save_checkpoint(tmp_path, 5, model, _state(5))
    fresh = TinyClassifier()
    state = load_checkpoint(tmp_path, fresh)
    assert state["step"] == 5
    assert torch.equal(state["optimizer"]["moments"], torch.arange(3.0))
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_interrupted_write_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    model = TinyClassifier()
    save_checkpoint(tmp_path, 1, model, _state(1))
    expected = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)

    def crash_mid_write(obj, path, *args, **kwargs):
        with open(path, "wb") as handle:
            handle.write(b"half a file")
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(checkpoint_module.torch, "save", crash_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model, _state(2))
    monkeypatch.undo()

    assert resolve_checkpoint(tmp_path).name == "step-00000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001"]
    fresh = TinyClassifier()
    assert load_checkpoint(tmp_path, fresh)["step"] == 1
    for a, b in zip(expected, fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_keeps_only_the_newest(tmp_path):
    model = TinyClassifier()
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, model, _state(step), keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000004"]
    assert load_checkpoint(tmp_path)["step"] == 4


def test_state_with_pickled_code_is_refused(tmp_path):
    model = TinyClassifier()
    save_checkpoint(tmp_path, 1, model, {"callable": print})
    with pytest.raises(CheckpointError, match="refers to the Python object print") as raised:
        load_checkpoint(tmp_path)
    assert "weights_only" not in str(raised.value)  # never advise running the file's code


def test_missing_and_foreign_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="is not a convergent checkpoint"):
        resolve_checkpoint(tmp_path)


def test_checkpoint_that_does_not_fit_the_model(tmp_path):
    save_checkpoint(tmp_path, 1, TinyClassifier(classes=3), _state(1))
    with pytest.raises(CheckpointError, match="does not fit the model"):
        load_checkpoint(tmp_path, torch.nn.Linear(2, 2))
