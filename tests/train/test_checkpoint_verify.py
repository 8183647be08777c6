"""Checkpoint retention by write order, manifests, verification and fallback, clean errors."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch

from convergent.train import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint
from convergent.train import checkpoint as checkpoint_module
from tests.conftest import TinyClassifier

LOGGER = "convergent.train.checkpoint"


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """A process warns once per damaged checkpoint; each test starts with none warned."""
    checkpoint_module._warned.clear()
    yield
    checkpoint_module._warned.clear()


def _state(step: int) -> dict:
    return {"step": step, "optimizer": {"lr": 0.1, "moments": torch.arange(3.0)}}


def _model(seed: int) -> TinyClassifier:
    torch.manual_seed(seed)
    return TinyClassifier()


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# Defect 1: retention by write order, never the checkpoint `latest` names.


def test_a_second_run_into_the_same_folder_keeps_its_own_checkpoints(tmp_path):
    model = TinyClassifier()
    for step in (20, 30):  # an old run
        save_checkpoint(tmp_path, step, model, _state(step), keep=2)
    for step in (10, 15):  # a new run, written later into the same folder
        save_checkpoint(tmp_path, step, model, _state(step), keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000010", "step-00000015"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000015"
    assert resolve_checkpoint(tmp_path).name == "step-00000015"
    assert load_checkpoint(tmp_path)["step"] == 15


def test_retention_never_deletes_the_checkpoint_latest_names(tmp_path):
    model = TinyClassifier()
    for step in (50, 60, 7):
        save_checkpoint(tmp_path, step, model, _state(step), keep=1)
        named = (tmp_path / "latest").read_text().strip()
        assert named == f"step-{step:08d}" and (tmp_path / named).is_dir()
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-00000007"]


def test_rewriting_a_step_counts_as_the_newest_write(tmp_path):
    model = TinyClassifier()
    for step in (1, 2, 1):
        save_checkpoint(tmp_path, step, model, _state(step), keep=2)
    assert resolve_checkpoint(tmp_path).name == "step-00000001"
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000001", "step-00000002"]
    save_checkpoint(tmp_path, 3, model, _state(3), keep=2)  # drops 2, the oldest write
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000001", "step-00000003"]


# Defect 2: a manifest written last; verification; one-line warning and fallback.


def test_manifest_records_the_step_and_each_file_hash(tmp_path):
    folder = save_checkpoint(tmp_path, 7, TinyClassifier(), _state(7))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["step"] == 7
    assert set(manifest["files"]) == {"model.safetensors", "state.pt"}
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert checkpoint_module.verify_checkpoint(folder) is None


def test_a_failed_manifest_write_leaves_no_checkpoint_folder(tmp_path, monkeypatch):
    model = TinyClassifier()
    save_checkpoint(tmp_path, 1, model, _state(1))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(checkpoint_module, "_write_manifest", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model, _state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001"]


@pytest.mark.parametrize(
    ("damage", "file"),
    [
        (_flip_a_byte, "model.safetensors"),
        (_truncate, "state.pt"),
        (lambda path: path.unlink(), "manifest.json"),
        (lambda path: path.write_text("{not json"), "manifest.json"),
    ],
    ids=["flipped-weights", "truncated-state", "missing-manifest", "garbled-manifest"],
)
def test_verify_checkpoint_names_the_file_that_failed(tmp_path, damage, file):
    folder = save_checkpoint(tmp_path, 3, TinyClassifier(), _state(3))
    damage(folder / file)
    reason = checkpoint_module.verify_checkpoint(folder)
    assert reason is not None and file in reason


@pytest.mark.parametrize(
    ("damage", "file"),
    [
        (_flip_a_byte, "model.safetensors"),
        (_truncate, "state.pt"),
        (lambda path: path.unlink(), "manifest.json"),
    ],
    ids=["flipped-weights", "truncated-state", "missing-manifest"],
)
def test_a_damaged_newest_checkpoint_falls_back_with_one_warning_line(
    tmp_path, caplog, damage, file
):
    older = _model(1)
    save_checkpoint(tmp_path, 1, older, _state(1))
    newest = save_checkpoint(tmp_path, 2, _model(2), _state(2))
    damage(newest / file)
    fresh = _model(3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state = load_checkpoint(tmp_path, fresh)
    assert state["step"] == 1
    for a, b in zip(older.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    (line,) = _warnings(caplog)
    assert "\n" not in line and "step-00000002" in line and file in line


def test_latest_naming_a_deleted_folder_falls_back(tmp_path, caplog):
    save_checkpoint(tmp_path, 1, TinyClassifier(), _state(1))
    (tmp_path / "latest").write_text("step-00000009\n")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert resolve_checkpoint(tmp_path).name == "step-00000001"
    (line,) = _warnings(caplog)
    assert "step-00000009" in line


def test_no_verified_checkpoint_is_one_sentence(tmp_path, caplog):
    for step in (1, 2):
        folder = save_checkpoint(tmp_path, step, TinyClassifier(), _state(step), keep=2)
        _flip_a_byte(folder / "state.pt")
    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pytest.raises(CheckpointError) as raised,
    ):
        load_checkpoint(tmp_path)
    message = str(raised.value)
    assert "verif" in message and "\n" not in message and message.count(". ") == 0
    assert len(_warnings(caplog)) == 2


def test_an_explicitly_named_damaged_checkpoint_raises_without_fallback(tmp_path):
    save_checkpoint(tmp_path, 1, TinyClassifier(), _state(1))
    newest = save_checkpoint(tmp_path, 2, TinyClassifier(), _state(2))
    _flip_a_byte(newest / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"step-00000002.*model\.safetensors") as raised:
        load_checkpoint(newest, TinyClassifier())
    assert "\n" not in str(raised.value)
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        resolve_checkpoint(newest)


def test_a_checkpoint_from_an_earlier_version_loads_with_an_unverified_warning(tmp_path, caplog):
    model = _model(1)
    folder = save_checkpoint(tmp_path, 4, model, _state(4))
    (folder / "manifest.json").unlink()  # as written before manifests existed
    for path in (tmp_path, folder):
        caplog.clear()
        checkpoint_module._warned.clear()  # one warning per process and checkpoint: reset
        fresh = _model(2)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert load_checkpoint(path, fresh)["step"] == 4
        for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
            assert torch.equal(a, b)
        (line,) = _warnings(caplog)
        assert "unverified" in line and "step-00000004" in line


# Defect 3: corrupt or malicious state and weights are one sentence, never "weights_only=False".


def _assert_clean(error: CheckpointError) -> None:
    message = str(error)
    assert "weights_only" not in message and "\n" not in message
    assert "corrupt or not a convergent checkpoint" in message


def test_state_with_pickled_code_is_a_clean_error(tmp_path):
    save_checkpoint(tmp_path, 1, TinyClassifier(), {"callable": print})
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(tmp_path)
    _assert_clean(raised.value)
    assert "state.pt" in str(raised.value)


def _legacy(tmp_path):
    folder = save_checkpoint(tmp_path, 1, TinyClassifier(), _state(1))
    (folder / "manifest.json").unlink()  # no manifest: the loaders themselves must catch it
    return folder


def test_a_garbage_state_file_is_a_clean_error(tmp_path):
    folder = _legacy(tmp_path)
    (folder / "state.pt").write_bytes(b"\x80\x02garbage that is no pickle")
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(folder)
    _assert_clean(raised.value)


def test_a_truncated_state_file_is_a_clean_error(tmp_path):
    folder = _legacy(tmp_path)
    _truncate(folder / "state.pt")
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(folder)
    _assert_clean(raised.value)


@pytest.mark.parametrize("damage", [_truncate, lambda path: path.write_bytes(b"\xff" * 64)])
def test_a_corrupt_safetensors_file_is_a_clean_error(tmp_path, damage):
    folder = _legacy(tmp_path)
    damage(folder / "model.safetensors")
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(folder, TinyClassifier())
    _assert_clean(raised.value)
    assert "model.safetensors" in str(raised.value)


def test_a_damaged_checkpoint_is_reported_once_per_process(tmp_path, caplog):
    model = _model(1)
    save_checkpoint(tmp_path, 1, model, _state(1), keep=3)
    newest = save_checkpoint(tmp_path, 2, model, _state(2), keep=3)
    (newest / "manifest.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):  # e.g. the resume checks, then the load
            assert load_checkpoint(tmp_path, _model(2))["step"] == 1
    assert len(_warnings(caplog)) == 1
