"""transformers' own ``from_pretrained`` reads compressed folders (``import convergent``
registers the reader): the same bits as ``load_sparse``, and pipelines, Trainer and PEFT."""

from __future__ import annotations

import json

import pytest
import torch

import convergent  # noqa: F401 - registers the reader
from convergent.commands import load_sparse, save_sparse
from convergent.sparse import prune_one_shot
from convergent.sparse.storage import COMPRESSED_WEIGHTS, QUANT_METHOD
from tests.commands.test_compressed import _assert_same_bits
from tests.conftest import tiny_bert_config


def _tiny(architecture: str):
    import transformers as hf

    if architecture == "llama":
        config = hf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                max_position_embeddings=64)  # fmt: skip
        return hf.LlamaForCausalLM(config), hf.AutoModelForCausalLM
    if architecture == "gpt2":
        config = hf.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
        return hf.GPT2LMHeadModel(config), hf.AutoModelForCausalLM
    if architecture == "opt":
        config = hf.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                              num_attention_heads=2, vocab_size=64, word_embed_proj_dim=32,
                              max_position_embeddings=32)  # fmt: skip
        return hf.OPTForCausalLM(config), hf.AutoModelForCausalLM
    config = tiny_bert_config(vocab_size=64, num_labels=2)
    return hf.BertForSequenceClassification(config), hf.AutoModelForSequenceClassification


def _saved(architecture: str, dtype: torch.dtype, folder):
    torch.manual_seed(0)
    model, auto = _tiny(architecture)
    model = model.to(dtype).eval()
    prune_one_shot(model, 0.7)  # -0.0 where weights were negative: kept bit for bit
    save_sparse(model, folder)
    return model, auto


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("architecture", ["llama", "gpt2", "opt", "bert"])
def test_from_pretrained_equals_load_sparse_bit_for_bit(architecture, dtype, tmp_path):
    model, auto = _saved(architecture, dtype, tmp_path / "sparse")
    config = json.loads((tmp_path / "sparse" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == QUANT_METHOD
    header = json.dumps(json.loads((tmp_path / "sparse" / "config.json").read_text()))
    assert "transformers_weights" not in header  # without convergent: refused, not random
    loaded = auto.from_pretrained(tmp_path / "sparse", local_files_only=True)
    reference = load_sparse(tmp_path / "sparse")
    _assert_same_bits(loaded, reference)
    _assert_same_bits(loaded, model)
    assert loaded.dtype == dtype and not loaded.training
    # an ordinary model now: no quantizer left on it, and save_pretrained writes a dense folder
    assert not getattr(loaded, "is_quantized", False)
    assert not hasattr(loaded.config, "quantization_config")
    assert not hasattr(loaded.config, "transformers_weights")
    loaded.save_pretrained(tmp_path / "dense")
    assert (tmp_path / "dense" / "model.safetensors").is_file()
    _assert_same_bits(auto.from_pretrained(tmp_path / "dense", local_files_only=True), model)


def test_a_dtype_asked_for_is_the_dtype_loaded(tmp_path):
    _saved("llama", torch.float32, tmp_path / "sparse")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "sparse", local_files_only=True, dtype=torch.bfloat16
    )
    reference = load_sparse(tmp_path / "sparse").to(torch.bfloat16)
    _assert_same_bits(loaded, reference)


def test_without_the_reader_transformers_refuses_the_folder(tmp_path, monkeypatch, caplog):
    from transformers import AutoModelForCausalLM
    from transformers.quantizers import auto
    from transformers.utils import logging as hf_logging

    _saved("gpt2", torch.float32, tmp_path / "sparse")
    monkeypatch.delitem(auto.AUTO_QUANTIZATION_CONFIG_MAPPING, QUANT_METHOD)
    monkeypatch.delitem(auto.AUTO_QUANTIZER_MAPPING, QUANT_METHOD)
    hf_logging.enable_propagation()
    try:
        with pytest.raises(OSError, match=r"model\.safetensors"):
            AutoModelForCausalLM.from_pretrained(tmp_path / "sparse", local_files_only=True)
    finally:
        hf_logging.disable_propagation()
    # transformers' own warning names the format, so a user can search for its reader
    assert f"Unknown quantization type, got {QUANT_METHOD}" in caplog.text


@pytest.mark.parametrize("device_map", ["cpu", "auto", {"": "cpu"}], ids=["cpu", "auto", "map"])
def test_a_device_map_that_places_every_module_loads_the_same_bits(device_map, tmp_path):
    model, auto = _saved("llama", torch.float32, tmp_path / "sparse")
    loaded = auto.from_pretrained(tmp_path / "sparse", local_files_only=True, device_map=device_map)
    _assert_same_bits(loaded, model)


def test_a_device_map_that_offloads_to_disk_is_refused_by_name(tmp_path):
    _, auto = _saved("llama", torch.float32, tmp_path / "sparse")
    places = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
              "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}  # fmt: skip
    with pytest.raises(ValueError, match=r"device_map offloads model\.layers\.1 to disk"):
        auto.from_pretrained(tmp_path / "sparse", local_files_only=True, device_map=places,
                             offload_folder=str(tmp_path / "offload"))  # fmt: skip
    # device_map="auto" under a memory cap places the whole model on disk: refused too
    with pytest.raises(ValueError, match="device_map offloads the model to disk"):
        auto.from_pretrained(tmp_path / "sparse", local_files_only=True, device_map="auto",
                             max_memory={"cpu": 20_000}, offload_folder=str(tmp_path / "off"))  # fmt: skip


def test_kernels_are_asked_for_through_quantization_config(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from convergent.sparse.transformers_quantizer import SparseFormatConfig

    _saved("llama", torch.float32, tmp_path / "sparse")
    asked = []
    monkeypatch.setattr(
        "convergent.sparse.kernels.to_sparse_kernels",
        lambda model, tokens: asked.append((model.training, tokens)),
    )
    AutoModelForCausalLM.from_pretrained(tmp_path / "sparse", local_files_only=True)
    assert asked == []  # the folder's own setting: dense
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "sparse",
        local_files_only=True,
        quantization_config=SparseFormatConfig(kernels=True, tokens=4),
    )
    assert asked == [(False, 4)] and model.is_quantized
    load_sparse(tmp_path / "sparse", kernels=True, tokens=2)
    assert asked[-1] == (False, 2)
    with pytest.raises(ValueError, match="tokens=0 is out of range"):
        SparseFormatConfig(tokens=0)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
                         max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    prune_one_shot(model, 0.5)
    folder = tmp_path_factory.mktemp("llama") / "sparse"
    save_sparse(model, folder, tokenizer=tokenizer)
    return folder


def test_a_text_generation_pipeline_generates_from_a_compressed_folder(llama_folder):
    from transformers import pipeline

    generate = pipeline("text-generation", model=str(llama_folder), device="cpu")
    text = generate("the film is", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert text.startswith("the film is") and len(text) > len("the film is")


def test_trainer_and_peft_take_the_loaded_model(llama_folder, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(llama_folder, local_files_only=True)
    ids = torch.randint(
        0, model.config.vocab_size, (4, 8), generator=torch.Generator().manual_seed(0)
    )
    data = [{"input_ids": row, "labels": row} for row in ids]
    arguments = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=2,
                                  per_device_train_batch_size=2, report_to=[], use_cpu=True,
                                  save_strategy="no", disable_tqdm=True)  # fmt: skip
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    Trainer(model=model, args=arguments, train_dataset=data).train()
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)

    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(llama_folder, local_files_only=True),
        LoraConfig(r=2, target_modules=["q_proj", "v_proj"]),
    )
    assert lora(input_ids=ids[:1]).logits.shape == (1, 8, model.config.vocab_size)
    assert 0 < sum(p.numel() for p in lora.parameters() if p.requires_grad) < 10_000
    assert (llama_folder / COMPRESSED_WEIGHTS).is_file()


def test_import_convergent_registers_the_reader_without_importing_transformers():
    import subprocess
    import sys

    code = (
        "import sys, convergent\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules\n"
        "from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING\n"
        f"assert {QUANT_METHOD!r} in AUTO_QUANTIZER_MAPPING\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
