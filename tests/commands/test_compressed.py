"""Compressed model folders (``save_sparse``, ``load_sparse``, ``prune --save``) and
``convergent bench``, on tiny models, offline."""

from __future__ import annotations

import json

import pytest
import torch

import convergent.commands.compressed as compressed_module
from convergent.cli import main
from convergent.commands import load_sparse, prune_hf_folder, prune_run, save_sparse
from convergent.commands.benchmark import bench, format_bench
from convergent.commands.pruned_folder import SaveOptions
from convergent.sparse import prune_one_shot
from convergent.sparse.storage import COMPRESSED_WEIGHTS, CompressedFileError
from tests.commands.conftest import EXAMPLES, MAX_LENGTH
from tests.sparse.test_encoding import bits_of
from tests.sparse.test_storage import _flip_last_byte_of


def _assert_same_bits(model, other) -> None:
    left, right = model.state_dict(), other.state_dict()
    assert left.keys() == right.keys()
    for name, value in left.items():
        assert value.dtype == right[name].dtype and torch.equal(
            bits_of(value), bits_of(right[name])
        ), name


@pytest.fixture(scope="module")
def pruned_gpt2_model(gpt2_folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gpt2_folder, local_files_only=True)
    prune_one_shot(model, 0.9)  # leaves -0.0 where weights were negative: kept bit for bit
    return model.eval()


def test_a_hugging_face_model_round_trips_and_from_pretrained_reads_it(
    pruned_gpt2_model, tokenizer, tmp_path
):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "gpt2-sparse"
    assert save_sparse(pruned_gpt2_model, out, tokenizer=tokenizer) == out
    assert (out / COMPRESSED_WEIGHTS).is_file() and not (out / "model.safetensors").exists()
    assert not list(tmp_path.glob(".*partial*"))  # the staging folder is gone
    reloaded = load_sparse(out)
    _assert_same_bits(reloaded, pruned_gpt2_model)
    assert reloaded.lm_head.weight is reloaded.transformer.wte.weight and not reloaded.training
    # import convergent registered the reader (test_from_pretrained.py: refused without it)
    _assert_same_bits(AutoModelForCausalLM.from_pretrained(out, local_files_only=True), reloaded)
    dense_size = sum(v.numel() * v.element_size() for v in pruned_gpt2_model.state_dict().values())
    assert (out / COMPRESSED_WEIGHTS).stat().st_size < dense_size


def test_a_damaged_folder_is_one_sentence_everywhere(
    pruned_gpt2_model, tokenizer, tmp_path, capsys
):
    out = tmp_path / "damaged"
    save_sparse(pruned_gpt2_model, out, tokenizer=tokenizer)
    _flip_last_byte_of(out / COMPRESSED_WEIGHTS, "transformer.h.1.mlp.c_proj.weight#values")
    with pytest.raises(CompressedFileError, match="does not match its sha256"):
        load_sparse(out)
    for argv in (["bench", str(out), "--no-memory"], ["prune", str(out), "--max-length", "16"]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1
        assert "does not match its sha256 (nothing was loaded)" in err


def test_folders_that_are_not_compressed_are_refused(gpt2_folder, tmp_path):
    with pytest.raises(CompressedFileError, match="holds ordinary weights, not compressed ones"):
        load_sparse(gpt2_folder)
    with pytest.raises(CompressedFileError, match="the path does not exist"):
        load_sparse(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="pass run_config=, the TrainConfig"):
        save_sparse(torch.nn.Linear(2, 2), tmp_path / "linear")
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists and is not empty"):
        save_sparse(torch.nn.Linear(2, 2), tmp_path / "occupied", run_config=object())


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("digits") / "run"
    argv = ["train", "--data", "digits", "--model", "transformer", "--steps", "3"]
    assert main([*argv, "--d-model", "16", "--out", str(run), "--no-progress"]) == 0
    return run


def test_a_run_folder_saved_compressed_loads_bit_for_bit(digits_run, tmp_path):
    from convergent.commands import load_run

    run = load_run(digits_run)
    prune_one_shot(run.model, 0.8)
    saved = save_sparse(run.model, tmp_path / "lm", run_config=run.config, step=3)
    assert saved == tmp_path / "lm" / "checkpoints" / "step-00000003"
    assert (saved / COMPRESSED_WEIGHTS).is_file() and not (saved / "model.safetensors").exists()
    _assert_same_bits(load_sparse(tmp_path / "lm"), run.model)
    with pytest.raises(CompressedFileError, match="holds ordinary weights"):
        load_sparse(digits_run)


def test_prune_save_writes_compressed_with_sizes_and_bench_figures(
    digits_run, tmp_path, monkeypatch
):
    measured = []

    def fake_bench(path, threads=None):
        measured.append(path)
        return {"source": str(path), "model": "m", "dtype": "float32", "sparsity": 0.5,
                "device": "cpu", "threads": 1, "notes": [], "memory": None,
                "sizes": {"dense_bytes": 4 << 20, "compressed_bytes": 1 << 20,
                          "compressed_file": True},
                "lengths": [{"tokens": 1, "dense_seconds": 0.002, "sparse_seconds": 0.001,
                             "speedup": 2.0, "dense_tokens_per_second": 500.0,
                             "sparse_tokens_per_second": 1000.0, "sparse_layers": 3,
                             "pruned_layers": 4}]}  # fmt: skip

    monkeypatch.setattr("convergent.commands.pruned_folder.bench", fake_bench)
    out = tmp_path / "pruned"
    summary = prune_run(digits_run, (0.5,), save_to=out, save=SaveOptions(bench=True))
    assert measured and measured[0].name.startswith(".pruned.partial")  # before the rename
    payload = json.loads((out / "pruning.json").read_text())
    sizes = payload["sizes"]
    assert sizes["compressed"] and sizes["file"] == COMPRESSED_WEIGHTS
    assert [row["name"] for row in sizes["layers"]] == [row["name"] for row in summary["layers"]]
    checkpoint = out / "checkpoints" / "step-00000003"
    assert summary["saved"] == str(checkpoint)
    assert sizes["file_bytes"] == (checkpoint / COMPRESSED_WEIGHTS).stat().st_size
    markdown = (out / "pruning.md").read_text()
    assert "load_sparse" in markdown and "## Size on disk" in markdown
    assert "| [1, 1] forward (ms) | 2.000 | 1.000 | 2.00x faster |" in markdown
    assert "| all weights |" in markdown


def test_prune_dense_writes_an_ordinary_folder(gpt2_folder, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "dense"
    argv = ["prune", str(gpt2_folder), "--sparsity", "0.5", "--examples", str(EXAMPLES)]
    argv += ["--data", "rt-sentences", "--max-length", str(MAX_LENGTH)]
    assert main([*argv, "--save", str(out), "--dense", "--no-bench"]) == 0
    assert (out / "model.safetensors").is_file() and not (out / COMPRESSED_WEIGHTS).exists()
    AutoModelForCausalLM.from_pretrained(out, local_files_only=True)  # any tool reads it
    assert "would take" in (out / "pruning.md").read_text()
    capsys.readouterr()
    assert main([*argv[:2], "--dense"]) == 2
    assert "--dense and --no-bench apply to --save FOLDER only" in capsys.readouterr().err


def test_bench_measures_dense_against_sparse_kernels(gpt2_folder, tmp_path, capsys):
    out = tmp_path / "pruned"
    prune_hf_folder(gpt2_folder, (0.9,), data="rt-sentences", examples=4,
                    max_length=MAX_LENGTH, save_to=out)  # fmt: skip
    result = bench(out, threads=1, lengths=(1, 8, 64), memory=True)
    assert [row["tokens"] for row in result["lengths"]] == [1, 8]
    assert result["notes"] == ["T = 64 skipped: past the model's 32 positions"]
    for row in result["lengths"]:
        assert row["pruned_layers"] == 8 and 0 <= row["sparse_layers"] <= 8
        assert row["dense_tokens_per_second"] == pytest.approx(row["tokens"] / row["dense_seconds"])
    assert result["sizes"]["compressed_file"]
    assert result["sizes"]["compressed_bytes"] == (out / COMPRESSED_WEIGHTS).stat().st_size
    for variant in ("dense", "sparse"):
        assert (
            result["memory"][variant]["peak_bytes"] >= result["memory"][variant]["model_bytes"] > 0
        )
    table = format_bench(result)
    assert "| [1, 8] forward (ms) |" in table and "| peak memory (MiB) |" in table
    capsys.readouterr()
    assert main(["bench", str(out), "--lengths", "4", "--threads", "1", "--no-memory"]) == 0
    assert "| tokens/s at T = 4 |" in capsys.readouterr().out
    assert main(["bench", str(out), "--lengths", "64"]) == 2
    assert "every length [64] is past the model's 32 positions" in capsys.readouterr().err


def test_compressed_folders_are_read_by_prune_and_diagnose(gpt2_folder, tmp_path):
    from convergent.commands import diagnose

    out = tmp_path / "pruned"
    prune_hf_folder(gpt2_folder, (0.5,), data="rt-sentences", examples=4,
                    max_length=MAX_LENGTH, save_to=out)  # fmt: skip
    again = prune_hf_folder(out, (0.7,), data="rt-sentences", examples=4, max_length=MAX_LENGTH)
    assert again["dense"]["perplexity"] == pytest.approx(
        json.loads((out / "pruning.json").read_text())["rows"][0]["perplexity"], rel=1e-5
    )
    assert diagnose(
        out, "rt-sentences", tmp_path / "d", examples=4, max_length=MAX_LENGTH
    ).is_file()
    assert compressed_module.weights_files(out) == [out / COMPRESSED_WEIGHTS]
