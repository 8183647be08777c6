"""``convergent train --sparsity S --sparsity-schedule {acdc,gmp,fixed}``: sparse training from
the command line, read back from the run folder (checkpoint tensors, metrics, summary)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from convergent.cli import main
from convergent.commands.runs import load_run
from convergent.sparse import MaskSpec

# The smallest run the other command tests use: one block, 16 wide.
TINY = ["train", "--data", "digits", "--model", "transformer", "--d-model", "16",
        "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--batch-size", "16",
        "--lr", "0.003", "--eval-every", "0", "--no-progress"]  # fmt: skip


def train(run: Path, *flags: str) -> int:
    return main([*TINY, *flags, "--out", str(run)])


def prunable_weights(run: Path) -> dict[str, torch.Tensor]:
    """The weights of the run's newest checkpoint that ``MaskSpec()`` selects."""
    loaded = load_run(run)
    names = MaskSpec().select(loaded.model).names
    parameters = dict(loaded.model.named_parameters())
    return {name: parameters[name].detach().clone() for name in names}


def train_records(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return [record for record in records if record["split"] == "train"]


def test_fixed_masks_hold_the_target_share_of_zeros_in_every_tensor(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run, "--steps", "6", "--sparsity", "0.8", "--sparsity-schedule", "fixed") == 0
    out = capsys.readouterr().out
    weights = prunable_weights(run)
    assert len(weights) >= 6  # at least q, k, v, o, up and down of the one block
    for name, weight in weights.items():
        n = weight.numel()
        expected = int(0.8 * n + 0.5) / n  # uniform: round(0.8 n) zeros per tensor
        assert float((weight == 0).sum()) / n == expected, name
    # the head and the input projection stay dense (include_first/last default to False)
    state = load_file(str(run / "checkpoints" / "step-00000006" / "model.safetensors"))
    assert int((state["head.weight"] == 0).sum()) == 0
    summary = json.loads((run / "summary.json").read_text())
    zeros = sum(int((w == 0).sum()) for w in weights.values())
    total = sum(w.numel() for w in weights.values())
    assert summary["sparsity"]["achieved"] == pytest.approx(zeros / total)
    assert summary["sparsity"]["schedule"] == "fixed" and summary["sparsity"]["target"] == 0.8
    assert summary["warnings"] == []
    assert "(fixed masks, target 0.8, uniform unstructured)" in out
    saved = json.loads((run / "config.json").read_text())
    assert saved["sparsity"] == 0.8 and saved["mask_spec"]["pattern"] == "unstructured"


def test_gmp_raises_the_sparsity_step_by_step_to_the_target(tmp_path):
    run = tmp_path / "run"
    assert train(run, "--steps", "20", "--sparsity", "0.8", "--sparsity-schedule", "gmp") == 0
    levels = [record["sparsity"] for record in train_records(run)]
    assert len(levels) == 20
    assert levels[0] == 0.0  # dense at first
    assert all(later >= earlier for earlier, later in itertools.pairwise(levels))
    assert len(set(levels)) >= 5  # a ramp, not one jump
    weights = prunable_weights(run)
    zeros = sum(int((w == 0).sum()) for w in weights.values())
    expected = sum(int(0.8 * w.numel() + 0.5) for w in weights.values())
    assert zeros == expected
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sparsity"]["method"] == "GMP" and summary["warnings"] == []


def test_acdc_alternates_and_its_summary_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--steps", "20", "--sparsity", "0.7", "--distribution", "global"]
    assert train(run, *flags) == 0  # acdc is the default schedule
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sparsity"]["schedule"] == "acdc" and summary["sparsity"]["method"] == "AC/DC"
    assert summary["sparsity"]["mask_spec"]["distribution"] == "global"
    assert "(AC/DC, target 0.7, global unstructured)" in out
    # dense and compressed phases alternate: several flips, compressed at the end
    compressed = [record["compressed"] for record in train_records(run)]
    flips = sum(a != b for a, b in itertools.pairwise(compressed))
    assert flips >= 4 and compressed[0] == 0.0 and compressed[-1] == 1.0
    assert summary["sparsity"]["compressions"] >= 3
    weights = prunable_weights(run)
    zeros = sum(int((w == 0).sum()) for w in weights.values())
    total = sum(w.numel() for w in weights.values())
    assert zeros == int(0.7 * total + 0.5)  # global: one count over all prunable weights


def test_two_four_keeps_two_of_every_four_consecutive_inputs(tmp_path):
    run = tmp_path / "run"
    flags = ["--steps", "6", "--sparsity", "0.5", "--sparsity-schedule", "fixed"]
    assert train(run, *flags, "--pattern", "2:4") == 0
    for name, weight in prunable_weights(run).items():
        assert weight.ndim == 2  # nn.Linear: (outputs, inputs)
        groups = weight.reshape(weight.shape[0], -1, 4)  # 4 consecutive inputs
        assert bool(((groups != 0).sum(dim=-1) == 2).all()), name


def test_sparse_training_wraps_a_regularized_objective(tmp_path):
    run = tmp_path / "run"
    flags = ["--steps", "4", "--sparsity", "0.5", "--sparsity-schedule", "fixed"]
    assert train(run, *flags, "--villani-target", "query_key") == 0
    assert all("penalty" in record for record in train_records(run))  # the regularizer's term
    for name, weight in prunable_weights(run).items():
        assert int((weight == 0).sum()) == int(0.5 * weight.numel() + 0.5), name


def test_a_resumed_sparse_run_continues_with_its_masks(tmp_path, monkeypatch, capsys):
    whole, parted = tmp_path / "whole", tmp_path / "parted"
    flags = ["--steps", "12", "--sparsity", "0.8", "--sparsity-schedule", "gmp",
             "--checkpoint-every", "4", "--schedule", "constant"]  # fmt: skip
    assert train(whole, *flags) == 0

    # Interrupt the second run after its 8th step, as Ctrl-C would: mid-ramp (GMP rebuilds the
    # masks before each of the steps 2 to 10).
    from convergent.train import loop

    real_batches = loop.iterate_batches

    def interrupted(*args, **kwargs):
        batches = real_batches(*args, **kwargs)
        for _ in range(8):
            yield next(batches)
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "iterate_batches", interrupted)
    assert train(parted, *flags) == 130
    monkeypatch.undo()
    at_eight = prunable_weights(parted)
    assert load_run(parted).state["step"] == 8
    assert sum(int((w == 0).sum()) for w in at_eight.values()) > 0

    assert train(parted, *flags, "--resume") == 0
    resumed, uninterrupted = prunable_weights(parted), prunable_weights(whole)
    for name, weight in resumed.items():
        assert bool((weight[at_eight[name] == 0] == 0).all()), name  # pruned stay pruned
        assert torch.equal(weight, uninterrupted[name]), name  # the same run, bit for bit
    summary = json.loads((parted / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["warnings"] == []

    # AC/DC's phases and GMP's ramp are laid over the run's steps: stretching one is refused.
    capsys.readouterr()
    assert train(parted, *flags, "--resume", "--steps", "30") == 2
    error = capsys.readouterr().err
    assert "--steps 30 would change the GMP schedule laid over the run's 12 steps" in error
    assert error.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sparsity", "1.5"], "sparsity must be in [0, 1) (0 or None: dense), got 1.5"),
        (
            ["--sparsity", "0.5", "--sparsity-schedule", "foo"],
            "--sparsity-schedule must be one of acdc, gmp, fixed, got 'foo'",
        ),
        (
            ["--pattern", "2:4"],
            "--pattern 2:4 applies to sparse training only; add --sparsity S with S in (0, 1),"
            " got None",
        ),
        (
            ["--sparsity-schedule", "acdc"],
            "--sparsity-schedule acdc applies to sparse training only",
        ),
        (
            ["--sparsity", "0.8", "--pattern", "2:4"],
            "--pattern 2:4 prunes 1 - N/M = 0.5 of the weights, so --sparsity must be 0.5, got 0.8",
        ),
        (
            ["--sparsity", "0.5", "--pattern", "2:4", "--sparsity-schedule", "gmp"],
            "--sparsity-schedule gmp ramps an unstructured sparsity; --pattern 2:4 takes acdc",
        ),
    ],
)
def test_bad_sparsity_settings_are_one_sentence(flags, message, tmp_path, capsys):
    assert train(tmp_path / "run", "--steps", "2", *flags) == 2
    error = capsys.readouterr().err
    assert message in error
    assert "Traceback" not in error and error.count("\n") == 1
    assert not (tmp_path / "run" / "config.json").exists()


def test_a_config_file_gives_the_mask_spec_and_flags_override_it(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"sparsity": 0.5, "mask_spec": {"pattern": "2:4", "exclude": ["up_proj"]}})
    )
    run = tmp_path / "run"
    flags = ["--config", str(config), "--steps", "2", "--sparsity-schedule", "fixed"]
    assert train(run, *flags, "--exclude", "down_proj") == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["mask_spec"]["pattern"] == "2:4"  # from the file
    assert saved["mask_spec"]["exclude"] == ["down_proj"]  # the flag replaces the file's
    weights = prunable_weights(run)
    loaded = dict(load_run(run).model.named_parameters())
    assert int((loaded["blocks.0.feed_forward.down_proj.weight"] == 0).sum()) == 0
    assert int((weights["blocks.0.feed_forward.up_proj.weight"] == 0).sum()) > 0
