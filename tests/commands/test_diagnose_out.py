"""``diagnose`` writes its report under ``--out``, by default into a new folder beside the
model, never into the model's own folder."""

from __future__ import annotations

import importlib
from pathlib import Path

from convergent.cli import main
from convergent.commands.diagnose_command import default_report_folder


def test_the_default_report_folder_is_new_and_beside_the_model(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    first = default_report_folder(str(model), None)
    assert first == tmp_path / "model-diagnostics"
    first.mkdir()
    assert default_report_folder(str(model), None) == tmp_path / "model-diagnostics-2"
    assert default_report_folder("minilm", "hf:a/b") == Path("diagnostics-minilm-hf-a_b")


def test_the_command_writes_beside_the_model_unless_told_where(tmp_path, monkeypatch, capsys):
    written: list[Path] = []

    def record(path, data, out, **options):
        written.append(Path(out))
        return Path(out) / "summary.md"

    module = importlib.import_module("convergent.commands.diagnose")
    monkeypatch.setattr(module, "diagnose", record)
    model = tmp_path / "model"
    model.mkdir()
    assert main(["diagnose", str(model), "--data", "rt-sentences"]) == 0
    assert main(["diagnose", str(model), "--out", str(tmp_path / "here")]) == 0
    assert written == [tmp_path / "model-diagnostics", tmp_path / "here"]
    assert not any(model.iterdir())
