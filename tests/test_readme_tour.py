"""The README's Python tour runs as written (the default run shortens its training loops)."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

from convergent.data import is_cached
from convergent.optim import _fast as fast_paths

README = Path(__file__).resolve().parents[1] / "README.md"


def tour_blocks() -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def _needs_fashion_mnist() -> None:
    if shutil.which("apt-get") is None and not is_cached("fashion-mnist"):
        pytest.skip("the tour's fashion-mnist needs apt-get (Debian or Ubuntu) or a cached copy")


def _run(code: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "readme_tour"}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_the_tour_has_its_blocks():
    blocks = tour_blocks()
    assert len(blocks) == 3
    assert "HORST(" in blocks[0] and "descent_step(" in blocks[1]
    assert "SparsityCallback(" in blocks[2]


def _confirmations(records) -> list[str]:
    return [r.getMessage() for r in records if r.name == "convergent.train.checks"]


def _numbers(text: str) -> list[float]:
    return [float(number) for number in re.findall(r"\d+(?:\.\d+)?", text)]


def assert_readme_lines_match(block: str, lines: list[str], numbers: bool = True) -> None:
    """Each "# INFO <method> acts: ..." comment in ``block`` is a line the run logged, with
    ``numbers`` its first number within 10 % (the README shows a run on one machine)."""
    shown = re.findall(r"# INFO (.*?) \(\.\.\.\)", block)
    assert shown, "the block shows no log line"
    for comment in shown:
        method = comment.split(" acts: ")[0]
        matches = [line for line in lines if line.startswith(f"{method} acts: ")]
        assert matches, f"no '{method} acts' line was logged; logged: {lines}"
        if numbers:
            logged, written = _numbers(matches[0])[0], _numbers(comment)[0]
            assert logged == pytest.approx(written, rel=0.1), (comment, matches[0])


def test_the_tour_runs_as_written_and_every_method_acts(tmp_path, monkeypatch, caplog):
    # The whole tour, 300 steps per fit as written (about 40 s): every method must act on
    # this model, so the run logs no warning, and the lines the README shows are the run's.
    _needs_fashion_mnist()
    code = "\n".join(tour_blocks()[:2])
    with caplog.at_level(logging.INFO, logger="convergent"):
        namespace = _run(code, tmp_path, monkeypatch)
    assert namespace["result"].step == 300
    assert (tmp_path / "runs" / "fmnist" / "checkpoints").is_dir()
    losses = namespace["losses"]
    assert losses.shape == (namespace["model"].num_layers + 1,)
    assert namespace["spectra"] is not None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [], [r.getMessage() for r in warnings]  # the tour loads nothing from HF
    lines = _confirmations(caplog.records)
    for method in ("HORST", "descent", "sparsity", "Langevin"):
        assert any(line.startswith(f"{method} acts: ") for line in lines), lines
    assert_readme_lines_match(code, lines)


def _prunable_sparsity(model) -> float:
    """Zeros among the weights SparsityCallback prunes by default, counted here: every
    nn.Linear weight but the first and the last in module order."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][1:-1]
    zeros = sum(int((m.weight == 0).sum()) for m in linears)
    return zeros / sum(m.weight.numel() for m in linears)


def test_the_trainer_example_runs_with_short_training(tmp_path, monkeypatch, caplog):
    # The README's Trainer block cut to 12 steps of 8 sentences (a reading of the checks at
    # every step, AC/DC with its phases) and one checkpoint: every import, call and argument
    # is the README's own. No check may warn, and the README's line is the run's.
    code = tour_blocks()[2]
    short = (
        code.replace("max_steps=300", "max_steps=12")
        .replace("save_steps=100", "save_steps=12")
        .replace("per_device_train_batch_size=32", "per_device_train_batch_size=8")
    )
    assert short.count("=12,") == 2 and "batch_size=8" in short
    # HORST's compiled path would compile MiniLM's step first (65 of this test's 70 s on a fresh
    # machine); its numbers equal the foreach path's (tests/optim/test_horst.py), so run that.
    monkeypatch.setattr(fast_paths, "COMPILE_MIN_NUMEL", 1 << 40)
    with caplog.at_level(logging.INFO, logger="convergent"):
        namespace = _run(short, tmp_path, monkeypatch)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 12
    assert _prunable_sparsity(namespace["model"]) == pytest.approx(0.8, abs=1e-3)
    assert (tmp_path / "runs" / "minilm-sparse" / "checkpoint-12" / "sparsity_state.pt").is_file()
    assert not any("warning" in entry for entry in trainer.state.log_history)
    assert not [r for r in caplog.records if r.name.startswith("convergent.") and r.levelno >= 30]
    lines = _confirmations(caplog.records)
    assert any(line.startswith("sparsity acts: ") for line in lines), lines
    assert_readme_lines_match(code, lines, numbers=False)  # the README's run is 300 steps
