"""``prune`` holds the model and at most one copy: the last target prunes the loaded model in
place (a single target copies nothing), with the same bits as a fresh prune at that target."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from convergent.commands import load_sparse, prune_hf_folder
from tests.commands.conftest import EXAMPLES, MAX_LENGTH

OPTIONS = {"data": "rt-sentences", "examples": EXAMPLES, "max_length": MAX_LENGTH,
           "calibration_examples": 8, "method": "wanda"}  # fmt: skip


@pytest.fixture
def model_copies(monkeypatch):
    import convergent.commands.prune_sweep as sweep_module

    copies: list[str] = []
    deepcopy = copy.deepcopy

    def counting(value, *args, **kwargs):
        if isinstance(value, nn.Module):
            copies.append(type(value).__name__)
        return deepcopy(value, *args, **kwargs)

    monkeypatch.setattr(sweep_module.copy, "deepcopy", counting)
    return copies


def test_each_target_but_the_last_is_pruned_on_a_copy(gpt2_folder, model_copies, tmp_path):
    one = prune_hf_folder(gpt2_folder, (0.7,), save_to=tmp_path / "one", **OPTIONS)
    assert model_copies == []
    two = prune_hf_folder(gpt2_folder, (0.5, 0.7), save_to=tmp_path / "two", **OPTIONS)
    assert model_copies == ["GPT2LMHeadModel"]
    assert two["rows"][1] == one["rows"][0]
    assert two["rows"][0]["sparsity"] == pytest.approx(0.5, abs=0.02)
    expected = load_sparse(tmp_path / "one").state_dict()
    got = load_sparse(tmp_path / "two").state_dict()
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
