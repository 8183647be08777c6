"""Reports a user can trust: a tied weight counted once on every path, the low-memory folder
holding what the in-memory one holds, files readable by others, ``bench`` counting the layers
``prune`` counts, a sparsity off its target explained, and each warning said once."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from convergent.commands import load_sparse, prune_hf_folder
from convergent.commands.benchmark import bench
from convergent.commands.pruning_report import format_prune_summary
from convergent.sparse import MaskSpec, prune_one_shot
from tests.commands.conftest import EXAMPLES, MAX_LENGTH

OPTIONS = {"data": "rt-sentences", "examples": EXAMPLES, "max_length": MAX_LENGTH,
           "calibration_examples": 8}  # fmt: skip


@pytest.fixture(scope="module")
def opt_folder(tmp_path_factory, tokenizer):
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64,
                       num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                       word_embed_proj_dim=32, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    folder = tmp_path_factory.mktemp("opt")
    OPTForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bfloat16_llama_folder(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    folder = tmp_path_factory.mktemp("llama-bf16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _pruned_share(folder, summary) -> float:
    """The pruned layers' zeros over every parameter of the written model, read back here (a
    tied one once: ``parameters()`` names each once, whatever shares it)."""
    model = load_sparse(folder)
    weights = dict(model.named_parameters())
    zeros = sum(int((weights[layer["name"]] == 0).sum()) for layer in summary["layers"])
    return zeros / sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["gpt2_folder", "opt_folder"])
def test_a_tied_lm_head_is_counted_once_with_and_without_low_memory(name, request, tmp_path):
    folder = request.getfixturevalue(name)
    in_memory = prune_hf_folder(folder, (0.5,), save_to=tmp_path / "a", **OPTIONS)
    streamed = prune_hf_folder(folder, (0.5,), save_to=tmp_path / "b", low_memory=True,
                               **OPTIONS)  # fmt: skip
    for summary, out in ((in_memory, tmp_path / "a"), (streamed, tmp_path / "b")):
        share = _pruned_share(out, summary)
        assert summary["rows"][0]["model_sparsity"] == pytest.approx(share, rel=1e-9)
        assert not any("lm_head" in excluded for excluded in summary["excluded"])
        assert "--include-last" not in format_prune_summary(summary)
    assert streamed["excluded"] == in_memory["excluded"]


def test_low_memory_writes_what_the_in_memory_save_writes(gpt2_folder, tmp_path):
    prune_hf_folder(gpt2_folder, (0.5,), save_to=tmp_path / "a", **OPTIONS)
    prune_hf_folder(gpt2_folder, (0.5,), save_to=tmp_path / "b", low_memory=True, **OPTIONS)
    for name in ("config.json", "generation_config.json"):
        written = [json.loads((tmp_path / out / name).read_text()) for out in ("a", "b")]
        # each names its own compressed weights (one file in memory, shards when streamed)
        for out, config in zip(("a", "b"), written, strict=True):
            weights = config.pop("quantization_config", {}).get("weights")
            assert name != "config.json" or (tmp_path / out / weights).is_file(), (out, weights)
        assert written[1] == written[0], name
    report = (tmp_path / "b" / "pruning.md").read_text()
    section = report.split("## Speed and memory")[1]
    assert "never holds the whole model" in section and "convergent bench" in section
    umask = os.umask(0o022)
    os.umask(umask)
    for out in (tmp_path / "a", tmp_path / "b"):
        for file in out.iterdir():
            assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file.name


def test_bench_counts_the_layers_prune_counts_and_warns_once(bfloat16_llama_folder, tmp_path,
                                                             caplog):  # fmt: skip
    out = tmp_path / "pruned"
    summary = prune_hf_folder(bfloat16_llama_folder, (0.5,), method="wanda", save_to=out,
                              **OPTIONS)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="convergent.sparse.kernels"):
        result = bench(out, lengths=[1, 4, 8], memory=False)
    # the untied LM head (left dense) and the embedding are not among the pruned layers
    assert result["dtype"] == "bfloat16"
    assert result["sparsity"] == pytest.approx(summary["rows"][0]["sparsity"], abs=1e-12)
    # at 50 % bfloat16 no kernel is tried (CSR and BSR take no bfloat16; the decode kernel's
    # bytes gain is under its floor): said once, not once per length
    missing = [r.getMessage() for r in caplog.records if "fewer bytes than dense" in r.getMessage()]
    assert len(missing) == 1, missing


def test_a_sparsity_off_its_target_comes_with_the_reason():
    from tests.sparse.test_blockwise import calibration, ours

    # rows of 32 inputs: Wanda prunes int(32 * 0.6) = 19 of each, 0.59375
    report = prune_one_shot(ours(), 0.6, method="wanda", calibration=calibration())
    assert report.sparsity == pytest.approx(19 / 32)
    (caveat,) = report.caveats
    assert "reached 0.5938, not the target 0.6" in caveat and "1/32 = 0.0312" in caveat
    owl = MaskSpec(distribution="owl", owl_m=2.0)
    report = prune_one_shot(ours(), 0.7, spec=owl, method="wanda", calibration=calibration())
    assert abs(report.sparsity - 0.7) > 0.005 and "OWL's block targets" in report.caveats[0]
    # within the slack: nothing to explain
    report = prune_one_shot(ours(), 0.5, method="wanda", calibration=calibration())
    assert report.sparsity == 0.5 and report.caveats == []
