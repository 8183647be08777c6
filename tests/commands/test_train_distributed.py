"""``convergent train`` under torchrun: DDP with the same global batch as one process.

Both tests read one two-rank 6-step run at a constant learning rate (a module fixture, and
one xdist group so that the Makefile's distributed pass runs them on one worker): one
torchrun launch fewer than a run per test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.launch import torchrun


def _train(folder: Path, processes: int, steps: int = 6, *extra: str) -> tuple[str, dict, dict]:
    printed = torchrun(
        "convergent",
        *("train", "--data", "digits", "--model", "transformer", "--d-model", "16"),
        *("--steps", str(steps), "--batch-size", "32", "--lr", "0.003", "--eval-every", "3"),
        *extra,
        *("--dropout", "0"),  # dropout masks are drawn per rank: no equality with them
        *("--device", "cpu", "--no-progress", "--test", "--out", str(folder)),
        processes=processes,
    )
    summary = json.loads((folder / "summary.json").read_text())
    checkpoint = max((folder / "checkpoints").glob("step-*"))
    weights = load_file(checkpoint / "model.safetensors")
    return printed, summary, weights


# A constant learning rate: the resumed 3-step run must be the first half of the 6-step one.
CONSTANT = ("--schedule", "constant", "--warmup-fraction", "0")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict, dict]:
    """A 6-step run on two ranks at a constant learning rate: its folder, what it printed,
    its summary and its last weights."""
    folder = tmp_path_factory.mktemp("two-ranks") / "run"
    return folder, *_train(folder, 2, 6, *CONSTANT)


@pytest.mark.distributed
@pytest.mark.xdist_group("train-under-torchrun")
def test_train_under_torchrun_equals_one_process(tmp_path, two_ranks):
    printed_one, one, weights_one = _train(tmp_path / "one", 1, 6, *CONSTANT)
    two_folder, printed_two, two, weights_two = two_ranks
    # rank 0 alone reports
    assert printed_one.count("test accuracy") == 1 and printed_two.count("test accuracy") == 1
    assert two["steps"] == one["steps"] == 6
    assert two["test"]["accuracy"] == pytest.approx(one["test"]["accuracy"])
    assert two["test"]["loss"] == pytest.approx(one["test"]["loss"], rel=1e-5)
    # the gradient's summation order differs across ranks; AdamW's m / sqrt(v) magnifies that
    # for entries whose gradient is near zero, up to ~1e-6 after 6 steps of 0.003 (each step
    # moves an entry by up to 0.003, so a wrong batch split would be off by ~1e-3)
    for name, value in weights_one.items():
        torch.testing.assert_close(weights_two[name], value, rtol=1e-5, atol=1e-5)
    # one writer: the metrics log has the single-process run's records, not one set per rank
    lines = [
        (folder / "metrics.jsonl").read_text().splitlines()
        for folder in (tmp_path / "one", two_folder)
    ]
    assert len(lines[1]) == len(lines[0]) > 0


@pytest.mark.distributed
@pytest.mark.xdist_group("train-under-torchrun")
def test_a_resumed_run_under_torchrun_continues_bit_for_bit(tmp_path, two_ranks):
    _, _, whole, weights_whole = two_ranks
    _train(tmp_path / "parts", 2, 3, *CONSTANT)
    _, resumed, weights_resumed = _train(tmp_path / "parts", 2, 6, "--resume")
    assert resumed["steps"] == whole["steps"] == 6
    for name, value in weights_whole.items():
        assert torch.equal(weights_resumed[name], value), name
    assert resumed["test"] == whole["test"]  # every rank's replica: the test set is split
