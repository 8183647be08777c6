"""``prune --low-memory``: blocks streamed from a folder's safetensors files, one in memory.

The streamed run must prune exactly as the in-memory run does (same masks, same weights, same
metrics), write a sharded folder that ``from_pretrained`` loads, and never hold two blocks'
weights at once.
"""

from __future__ import annotations

import json

import pytest
import torch

from convergent.cli import main
from convergent.commands import load_sparse, prune_hf_folder
from convergent.commands.pruned_folder import SaveOptions
from convergent.models.streamed import StreamedBlocks
from convergent.sparse import MaskSpec
from tests.commands.conftest import EXAMPLES, MAX_LENGTH

SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def _save(model, tokenizer, folder, shard: str | None = None):
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), **SMALL, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    # several shards, as a large model's folder has them
    return _save(LlamaForCausalLM(config), tokenizer, tmp_path_factory.mktemp("llama"), "2MB")


@pytest.fixture(scope="module")
def tied_llama_folder(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(tokenizer), **SMALL, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return _save(LlamaForCausalLM(config), tokenizer, tmp_path_factory.mktemp("tied"))


@pytest.fixture(scope="module")
def opt_folder(tmp_path_factory, tokenizer):
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64,
                       num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                       word_embed_proj_dim=32, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return _save(OPTForCausalLM(config), tokenizer, tmp_path_factory.mktemp("opt"))


@pytest.fixture(scope="module")
def bfloat16_llama_folder(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    config = LlamaConfig(vocab_size=len(tokenizer), **SMALL, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    return _save(model, tokenizer, tmp_path_factory.mktemp("bfloat16"), "2MB")


def _loaded_state(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).state_dict()


OPTIONS = {"data": "rt-sentences", "examples": EXAMPLES, "max_length": MAX_LENGTH,
           "calibration_examples": 8}  # fmt: skip


@pytest.mark.parametrize(("method", "dense"), [("sparsegpt", False), ("magnitude", True)])
def test_streaming_prunes_exactly_as_in_memory(llama_folder, tmp_path, method, dense):
    save = SaveOptions(dense=dense)
    in_memory = prune_hf_folder(llama_folder, (0.6,), method=method, save_to=tmp_path / "a",
                                save=save, **OPTIONS)  # fmt: skip
    streamed = prune_hf_folder(llama_folder, (0.6,), method=method, save_to=tmp_path / "b",
                               save=save, low_memory=True, **OPTIONS)  # fmt: skip
    assert streamed["dense"]["perplexity"] == pytest.approx(
        in_memory["dense"]["perplexity"], rel=1e-6
    )
    assert streamed["rows"][0]["perplexity"] == pytest.approx(
        in_memory["rows"][0]["perplexity"], rel=1e-6
    )
    assert streamed["rows"][0]["sparsity"] == in_memory["rows"][0]["sparsity"]
    # one shard per block and one for the rest, then the index
    stem = "model" if dense else "sparse_model"
    shards = sorted(path.name for path in (tmp_path / "b").glob(f"{stem}-*.safetensors"))
    assert shards == [f"{stem}-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    read = _loaded_state if dense else (lambda folder: load_sparse(folder).state_dict())
    expected, got = read(tmp_path / "a"), read(tmp_path / "b")
    assert list(expected) == list(got)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    assert "low memory" in (tmp_path / "b" / "pruning.md").read_text()
    sizes = streamed["sizes"]
    assert sizes["compressed"] is not dense
    if not dense:  # the shards' headers give the same sizes as the in-memory file's
        assert sizes["compressed_bytes"] == in_memory["sizes"]["compressed_bytes"]
        from transformers import AutoModelForCausalLM  # reads the shards' index too

        sharded = AutoModelForCausalLM.from_pretrained(tmp_path / "b", local_files_only=True)
        for name, value in sharded.state_dict().items():
            assert torch.equal(got[name], value), name


def test_only_one_block_holds_weights_at_a_time(llama_folder, tmp_path, monkeypatch):
    peaks = []
    enter, leave = StreamedBlocks.enter, StreamedBlocks.leave

    def loaded_blocks(host) -> int:
        blocks = host.streamed.model.get_submodule(host.prefix)
        return sum(any(p.device.type != "meta" for p in block.parameters()) for block in blocks)

    def recording_enter(self, index, block, device):
        enter(self, index, block, device)
        peaks.append(loaded_blocks(self))

    def recording_leave(self, index, block, pruned):
        leave(self, index, block, pruned)
        assert loaded_blocks(self) == 0

    monkeypatch.setattr(StreamedBlocks, "enter", recording_enter)
    monkeypatch.setattr(StreamedBlocks, "leave", recording_leave)
    prune_hf_folder(llama_folder, (0.5,), method="sparsegpt", save_to=tmp_path / "out",
                    low_memory=True, **OPTIONS)  # fmt: skip
    # dense evaluation, pruning, pruned evaluation: 3 passes over 3 blocks
    assert peaks == [1] * 9


def _outside_held(host) -> list[str]:
    """The parameters outside the blocks that hold data (not ``meta``)."""
    return [
        name
        for name, parameter in host.streamed.model.named_parameters(remove_duplicate=False)
        if not name.startswith(f"{host.prefix}.") and parameter.device.type != "meta"
    ]


@pytest.mark.parametrize(
    ("folder", "spec"),
    [
        ("llama_folder", None),
        ("tied_llama_folder", None),
        ("llama_folder", MaskSpec(include_last=True)),  # prunes the (untied) LM head
    ],
)
def test_the_modules_outside_the_blocks_are_not_held_while_blocks_run(
    folder, spec, request, tmp_path, monkeypatch
):
    path = request.getfixturevalue(folder)
    held = []
    enter = StreamedBlocks.enter

    def recording_enter(self, index, block, device):
        enter(self, index, block, device)
        held.append(_outside_held(self))

    monkeypatch.setattr(StreamedBlocks, "enter", recording_enter)
    in_memory = prune_hf_folder(path, (0.5,), method="sparsegpt", save_to=tmp_path / "a",
                                spec=spec, **OPTIONS)  # fmt: skip
    streamed = prune_hf_folder(path, (0.5,), method="sparsegpt", save_to=tmp_path / "b",
                               spec=spec, low_memory=True, **OPTIONS)  # fmt: skip
    # dense evaluation, pruning, pruned evaluation: 3 passes over 3 blocks; a pruned LM head
    # (and the embedding) stay from the pruning until written
    pruned_outside = spec is not None
    assert len(held) == 9
    assert all(bool(names) == pruned_outside for names in held), held
    assert streamed["rows"][0]["perplexity"] == pytest.approx(
        in_memory["rows"][0]["perplexity"], rel=1e-6
    )
    expected = load_sparse(tmp_path / "a").state_dict()
    got = load_sparse(tmp_path / "b").state_dict()
    assert list(expected) == list(got)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    if pruned_outside:
        assert float((got["lm_head.weight"] == 0).float().mean()) == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("folder", ["llama_folder", "gpt2_folder", "opt_folder", "bert_folder"])
def test_the_command_prunes_in_bfloat16_one_block_at_a_time(folder, request, tmp_path, capsys):
    from transformers import AutoConfig

    path = request.getfixturevalue(folder)
    out = tmp_path / "pruned"
    data = ["--data", "rt-sentences", "--examples", str(EXAMPLES), "--max-length",
            str(MAX_LENGTH), "--calibration-examples", "8"]  # fmt: skip
    code = main(["prune", str(path), "--method", "sparsegpt", "--sparsity", "0.5",
                 "--device", "cpu", "--dtype", "bfloat16", "--low-memory", "--save", str(out),
                 *data])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    config = AutoConfig.from_pretrained(out, local_files_only=True)
    assert str(config.dtype).removeprefix("torch.") == "bfloat16"
    weights = load_sparse(out).state_dict()  # written compressed, read bit for bit
    assert all(t.dtype == torch.bfloat16 for t in weights.values() if t.is_floating_point())
    summary = json.loads((out / "pruning.json").read_text())
    assert summary["dtype"] == "bfloat16" and summary["low_memory"] is True
    assert summary["sizes"]["compressed"] and summary["layers"]
    for layer in summary["layers"]:
        name = layer["name"]
        assert abs(layer["sparsity"] - 0.5) <= 1 / layer["shape"][-1] + 0.01, name
        zeros = float((weights[name] == 0).float().mean())
        assert zeros == pytest.approx(layer["sparsity"], abs=1e-6), name


def test_low_memory_refusals_are_one_sentence(llama_folder, tmp_path):
    with pytest.raises(ValueError, match="one target per call"):
        prune_hf_folder(llama_folder, (0.5, 0.7), save_to=tmp_path / "x", low_memory=True,
                        **OPTIONS)  # fmt: skip
    with pytest.raises(ValueError, match="name the folder to write it to"):
        prune_hf_folder(llama_folder, (0.5,), low_memory=True, **OPTIONS)
    assert not (tmp_path / "x").exists()


def test_each_block_left_hands_the_freed_memory_back(llama_folder, tmp_path, monkeypatch):
    # glibc keeps freed memory in its heaps; without malloc_trim after each block a streamed
    # run's resident size grew with the number of blocks (benchmarks/README.md)
    import convergent.models.streamed as streamed_module

    trims: list[int] = []
    monkeypatch.setattr(streamed_module, "_malloc_trim", lambda: trims.append)
    prune_hf_folder(llama_folder, (0.5,), method="sparsegpt", save_to=tmp_path / "out",
                    low_memory=True, **OPTIONS)  # fmt: skip
    # once after the data are read, then dense evaluation, pruning, pruned evaluation: 3
    # passes over 3 blocks, each trimmed
    assert trims == [0] * 10


def test_a_streamed_run_maps_its_large_allocations(llama_folder, tmp_path, monkeypatch):
    # glibc's dynamic mmap threshold kept freed blocks in its heaps: the streamed peak grew with
    # the number of blocks (623 -> 730 MiB from 2 to 8 blocks at d_model 1536; 552 -> 550 with
    # a fixed 1 MiB threshold: benchmarks/README.md). M_MMAP_THRESHOLD is -3 in glibc's malloc.h.
    import convergent.models.streamed as streamed_module

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(streamed_module, "_mallopt", lambda: lambda *a: calls.append(a))
    prune_hf_folder(llama_folder, (0.5,), method="magnitude", save_to=tmp_path / "out",
                    low_memory=True, **OPTIONS)  # fmt: skip
    assert calls == [(-3, 1024 * 1024)]


def test_a_bfloat16_folder_streams_in_its_own_dtype_as_in_memory(bfloat16_llama_folder, tmp_path):
    # no dtype given: both paths take the folder's own (bfloat16), the statistics float64
    in_memory = prune_hf_folder(bfloat16_llama_folder, (0.5,), method="sparsegpt",
                                save_to=tmp_path / "a", **OPTIONS)  # fmt: skip
    streamed = prune_hf_folder(bfloat16_llama_folder, (0.5,), method="sparsegpt",
                               save_to=tmp_path / "b", low_memory=True, **OPTIONS)  # fmt: skip
    assert in_memory["dtype"] == streamed["dtype"] == "bfloat16"
    for key in ("dense", "rows"):
        assert json.dumps(streamed[key]) == json.dumps(in_memory[key]), key
    expected = load_sparse(tmp_path / "a").state_dict()
    got = load_sparse(tmp_path / "b").state_dict()
    assert list(expected) == list(got)
    for name, value in expected.items():
        assert value.dtype == got[name].dtype, name
        assert torch.equal(got[name], value), name
    assert any(value.dtype == torch.bfloat16 for value in got.values())
