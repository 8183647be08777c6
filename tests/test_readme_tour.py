"""The README's Python tour runs as written (the default run shortens its training loops)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from convergent.data import is_cached

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


def test_the_tour_runs_with_short_training(tmp_path, monkeypatch):
    # The same code with 300 training steps cut to 6: every import, call and argument is the
    # README's own.
    _needs_fashion_mnist()
    code = "\n".join(tour_blocks()[:2])
    short = code.replace("max_steps=300", "max_steps=6")
    assert short.count("max_steps=6") == code.count("max_steps=300") == 2
    namespace = _run(short, tmp_path, monkeypatch)
    assert namespace["result"].step == 6
    assert (tmp_path / "runs" / "fmnist" / "checkpoints").is_dir()
    losses = namespace["losses"]
    assert losses.shape == (namespace["model"].num_layers + 1,)
    assert namespace["spectra"] is not None


@pytest.mark.slow
def test_the_tour_runs_as_written(tmp_path, monkeypatch):
    _needs_fashion_mnist()
    namespace = _run("\n".join(tour_blocks()[:2]), tmp_path, monkeypatch)
    assert namespace["result"].step == 300


def _prunable_sparsity(model) -> float:
    """Zeros among the weights SparsityCallback prunes by default, counted here: every
    nn.Linear weight but the first and the last in module order."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][1:-1]
    zeros = sum(int((m.weight == 0).sum()) for m in linears)
    return zeros / sum(m.weight.numel() for m in linears)


def test_the_trainer_example_runs_with_short_training(tmp_path, monkeypatch):
    # The README's Trainer block cut to 2 steps of 8 sentences (AC/DC over 2 steps is
    # compressed throughout) and one checkpoint: every import, call and argument is the
    # README's own.
    code = tour_blocks()[2]
    short = (
        code.replace("max_steps=300", "max_steps=2")
        .replace("save_steps=100", "save_steps=2")
        .replace("per_device_train_batch_size=32", "per_device_train_batch_size=8")
    )
    assert short.count("=2,") == 2 and "batch_size=8" in short
    namespace = _run(short, tmp_path, monkeypatch)
    assert namespace["trainer"].state.global_step == 2
    assert _prunable_sparsity(namespace["model"]) == pytest.approx(0.8, abs=1e-3)
    assert (tmp_path / "runs" / "minilm-sparse" / "checkpoint-2" / "sparsity_state.pt").is_file()
