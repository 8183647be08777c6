"""Generation speed (``bench --generate``, ``benchmarks/sparse_decode.py``) and what ``bench``
prints where no layer switched; no test depends on this machine's speed."""

from __future__ import annotations

import copy

import pytest
import torch

from convergent.cli import main
from convergent.commands import save_sparse
from convergent.commands.benchmark import bench, format_bench, switched_line
from convergent.commands.decode_speed import (
    generate_tokens,
    generation_line,
    prompt_ids,
    time_generation,
    weight_bytes_per_token,
)
from convergent.sparse import prune_one_shot
from convergent.sparse.decode_kernels import IndexedLinear
from convergent.sparse.kernels import SLOWER, TOO_DENSE, to_sparse_kernels
from convergent.sparse.streamed_timing import MAX_COPIES, Rotation, copies_to_stream


def _llama(vocabulary: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=vocabulary,
                         max_position_embeddings=64)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    prune_one_shot(model, 0.8)  # every layer past the decode kernel's 1.5x bytes floor
    return model


def _decode_timer(calls):
    """The decode kernel fastest, then dense, then the others."""
    seconds = {"dense": 2.0, "index16": 1.0}
    return [[seconds.get(str(call.layout).split(" ")[0], 3.0)] * 3 for call in calls]


def test_the_sparse_model_generates_the_dense_models_tokens():
    dense = _llama()
    sparse = copy.deepcopy(dense)
    report = to_sparse_kernels(sparse, tokens=1, timer=_decode_timer)
    assert len(report.converted) == 14
    assert isinstance(sparse.model.layers[0].mlp.down_proj, IndexedLinear)
    prompt = prompt_ids(dense, 8)
    with torch.no_grad():  # one token: the decoding step's kernel
        one = dense(prompt[:, :1]).logits
        assert torch.allclose(sparse(prompt[:, :1]).logits, one, rtol=1e-4, atol=1e-5)
    expected = generate_tokens(dense, prompt, 12)
    assert expected.shape == (1, 12)
    assert torch.equal(generate_tokens(sparse, prompt, 12), expected)
    result = time_generation(dense, sparse, prompt_tokens=8, new_tokens=12, repeats=1)
    assert result["same_tokens"]
    # float32 ELL: 4 + 2 bytes a slot, every row as many slots as its fullest row; head dense
    slots = sum(
        module.weight.shape[0] * int((module.weight != 0).sum(dim=1).max())
        for name, module in dense.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    )
    assert result["sparse_bytes_per_token"] == 64 * 64 * 4 + 6 * slots
    assert result["sparse_bytes_per_token"] < 0.7 * result["dense_bytes_per_token"]
    assert result["memory_limit"] == pytest.approx(
        result["dense_bytes_per_token"] / result["sparse_bytes_per_token"]
    )
    assert result["share_of_limit"] == pytest.approx(result["speedup"] / result["memory_limit"])


def test_bytes_per_token_count_every_linear_layer_once():
    model = _llama()
    linear = sum(
        module.weight.numel() * 4
        for module in model.modules()
        if isinstance(module, torch.nn.Linear)
    )
    assert weight_bytes_per_token(model) == linear


def _row(switched: int, pruned: int, causes: dict[str, int]) -> dict:
    return {"tokens": 1, "dense_seconds": 0.002, "sparse_seconds": 0.001, "speedup": 2.0,
            "dense_tokens_per_second": 500.0, "sparse_tokens_per_second": 1000.0,
            "sparse_layers": switched, "pruned_layers": pruned, "dense_causes": causes,
            "switched_speedup": 1.5 if switched else None}  # fmt: skip


def test_bench_prints_a_ratio_only_where_a_layer_switched():
    none = _row(0, 12, {TOO_DENSE: 8, SLOWER: 4})
    line = switched_line(none)
    assert line.startswith("T = 1: no layer switched, so no speed-up is printed (8 too dense")
    assert "4 slower on every sparse kernel than dense" in line and "x" not in line.split("(")[0]
    some = switched_line(_row(3, 12, {SLOWER: 9}))
    assert "3 of 12 pruned layers on sparse kernels, 1.50x faster over those layers" in some
    assert switched_line(_row(0, 0, {})) == (
        "T = 1: no layer switched: no linear layer has zeros, so none was tried."
    )
    result = {"source": "s", "model": "m", "dtype": "float32", "sparsity": 0.0, "device": "cpu",
              "threads": 1, "notes": [], "memory": None, "lengths": [none],
              "sizes": {"dense_bytes": 4, "compressed_bytes": 4, "compressed_file": False}}  # fmt: skip
    table = format_bench(result)
    assert "| [1, 1] forward (ms) | 2.000 | as dense | no layer switched |" in table
    assert "faster" not in table and "slower |" not in table


def test_bench_generate_on_a_compressed_folder(tmp_path, capsys, monkeypatch):
    from transformers import AutoTokenizer

    from convergent.data import minilm_path

    # each layer's choice by a fake clock (the decode kernel fastest): seconds, not minutes
    monkeypatch.setattr(
        "convergent.sparse.kernels.timed_samples", lambda calls, device: _decode_timer(calls)
    )
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    save_sparse(_llama(len(tokenizer)), tmp_path / "sparse", tokenizer=tokenizer)
    result = bench(tmp_path / "sparse", threads=1, lengths=(1,), memory=False, generate=4)
    (row,) = result["generate"]
    assert row["new_tokens"] == 4 and row["prompt_tokens"] == 32
    assert row["pruned_layers"] == 14 and row["dense_bytes_per_token"] > 0
    line = generation_line(row)
    assert row["sparse_layers"] == 14 and row["same_tokens"]
    assert "MiB sparse, a limit of" in line and "the same tokens as dense" in line
    assert line in format_bench(result)
    row.update(sparse_layers=0, dense_causes={TOO_DENSE: 14})
    assert generation_line(row).endswith(
        "no layer switched at one token, so no speed-up is printed (14 too dense to try (below"
        " the least sparsity))."
    )
    capsys.readouterr()
    assert main(["bench", str(tmp_path / "sparse"), "--generate", "64", "--no-memory"]) == 2
    assert "--generate 64 is out of range; it must be in [1, 63]" in capsys.readouterr().err


def test_streamed_timing_copies_and_rotates():
    cache = 32 * 2**20
    assert copies_to_stream(4 * 2**20, model_bytes=16 * 2**20, cache_bytes=cache) == 1
    assert copies_to_stream(4 * 2**20, model_bytes=400 * 2**20, cache_bytes=cache) == 16
    assert copies_to_stream(1024, model_bytes=400 * 2**20, cache_bytes=cache) == MAX_COPIES
    seen = []
    rotation = Rotation([lambda x: seen.append(("a", x)), lambda x: seen.append(("b", x))], 7, "d")
    for _ in range(3):
        rotation()
    assert seen == [("a", 7), ("b", 7), ("a", 7)] and rotation.layout == "d"


def test_bench_on_a_dense_folder_prints_no_speed_up(gpt2_folder, capsys):
    capsys.readouterr()
    assert main(["bench", str(gpt2_folder), "--lengths", "1", "--threads", "1", "--no-memory"]) == 0
    out = capsys.readouterr().out
    assert "| [1, 1] forward (ms) |" in out and "| as dense | no layer switched |" in out
    assert "T = 1: no layer switched: no linear layer has zeros, so none was tried." in out
    assert "faster" not in out and "x slower" not in out
