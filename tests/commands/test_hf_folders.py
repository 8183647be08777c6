"""``prune`` and ``diagnose`` on Hugging Face ``save_pretrained`` folders (tiny, offline)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from convergent.cli import main
from convergent.commands import diagnose, load_sparse, prune_hf_folder
from convergent.commands.hf_folders import (
    HFFolderError,
    evaluation_data,
    folder_kind,
    is_hf_model_folder,
    load_hf_folder,
)
from convergent.sparse import MaskSpec, prune_one_shot
from tests.commands.conftest import EXAMPLES, MAX_LENGTH
from tests.conftest import assert_drawn_figure, tiny_bert_config


@pytest.fixture(scope="module")
def pruned_gpt2(gpt2_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("pruned") / "gpt2-0.5"
    summary = prune_hf_folder(
        gpt2_folder, (0.5,), data="rt-sentences", examples=EXAMPLES, max_length=MAX_LENGTH,
        save_to=out,
    )  # fmt: skip
    return summary, out


def _perplexity(model, batch) -> float:
    """exp(mean cross-entropy of each real token after the first), counted here."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets, keep = batch["input_ids"][:, 1:], batch["attention_mask"][:, 1:].bool()
    losses = F.cross_entropy(logits[:, :-1][keep], targets[keep], reduction="none")
    return math.exp(float(losses.double().mean()))


def _accuracy(model, batch) -> float:
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    with torch.no_grad():
        predictions = model(**inputs).logits.argmax(dim=-1)
    return int((predictions == batch["labels"]).sum()) / len(batch["labels"])


def test_folders_are_told_apart(gpt2_folder, tmp_path):
    assert is_hf_model_folder(gpt2_folder) and folder_kind(gpt2_folder) == "hugging-face"
    assert folder_kind(tmp_path / "nowhere") == "run"  # load_run explains a missing path
    loaded = load_hf_folder(gpt2_folder)
    assert (loaded.kind, loaded.architecture) == ("causal-lm", "GPT2LMHeadModel")


def test_pruned_folder_reloads_with_the_library_pruning(gpt2_folder, pruned_gpt2):
    from transformers import AutoModelForCausalLM

    summary, out = pruned_gpt2
    reloaded = load_sparse(out)
    reference = AutoModelForCausalLM.from_pretrained(gpt2_folder, local_files_only=True)
    report = prune_one_shot(reference, 0.5)  # the library path, same defaults as the command
    expected = reference.state_dict()
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, expected[name]), name
    names = MaskSpec(include_first=True).select(reloaded).names
    assert names == list(report.masks) and len(names) == 8  # 4 Conv1D per GPT-2 block
    for name in names:
        weight = reloaded.get_parameter(name)
        assert float((weight == 0).float().mean()) == pytest.approx(0.5, abs=1e-3), name
    assert summary["rows"][0]["sparsity"] == pytest.approx(report.sparsity)
    assert "transformer.wte.weight" in summary["excluded"]  # tied to lm_head: left dense
    payload = json.loads((out / "pruning.json").read_text())
    assert [row["name"] for row in payload["layers"]] == names
    assert all(row["sparsity"] == pytest.approx(0.5, abs=1e-3) for row in payload["layers"])


def test_language_model_perplexity_is_counted_exactly(gpt2_folder, pruned_gpt2, validation):
    from transformers import AutoModelForCausalLM

    summary, out = pruned_gpt2
    assert (summary["metric"], summary["examples"]) == ("perplexity", EXAMPLES)
    dense = AutoModelForCausalLM.from_pretrained(gpt2_folder, local_files_only=True)
    pruned = load_sparse(out)
    before, after = _perplexity(dense, validation), _perplexity(pruned, validation)
    assert summary["dense"]["perplexity"] == pytest.approx(before, rel=1e-5)
    assert summary["rows"][0]["perplexity"] == pytest.approx(after, rel=1e-5)
    assert before != pytest.approx(after, rel=1e-6)  # pruning changed the model
    markdown = (out / "pruning.md").read_text()
    assert "| dense |" in markdown and "![pruning](pruning.png)" in markdown
    assert_drawn_figure(out / "pruning.png")


def test_classifier_accuracy_is_counted_exactly(bert_folder, validation, tmp_path):
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "bert-pruned"
    summary = prune_hf_folder(
        bert_folder, (0.3, 0.5), examples=EXAMPLES, max_length=MAX_LENGTH, save_to=out,
        spec=MaskSpec(distribution="global"),
    )  # fmt: skip
    assert (summary["data"], summary["metric"]) == ("rt-sentences", "accuracy")
    dense = AutoModelForSequenceClassification.from_pretrained(bert_folder)
    pruned = load_sparse(out)
    assert summary["dense"]["accuracy"] == _accuracy(dense, validation)
    assert summary["rows"][-1]["accuracy"] == _accuracy(pruned, validation)
    assert summary["rows"][-1]["sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert [row["target"] for row in json.loads((out / "pruning.json").read_text())["rows"]] == [
        0.3,
        0.5,
    ]


def test_n_m_pattern_on_a_saved_folder(bert_folder, tmp_path):
    summary = prune_hf_folder(
        bert_folder, (0.5,), spec=MaskSpec(pattern="2:4"), examples=4, max_length=MAX_LENGTH,
        save_to=tmp_path / "two-four",
    )  # fmt: skip
    pruned = load_sparse(tmp_path / "two-four")
    weight = pruned.get_parameter("bert.encoder.layer.0.attention.self.query.weight")
    assert bool(((weight.reshape(-1, 4) != 0).sum(dim=1) <= 2).all())  # 2 of each 4 inputs
    assert summary["rows"][0]["sparsity"] == pytest.approx(0.5)


def test_austen_windows_are_decoded_back_to_text(gpt2_folder, monkeypatch):
    import convergent.data.text_loaders as text_loaders

    books = {f"book {i}": "".join(chr(97 + (i + k) % 26) for k in range(4000)) for i in range(2)}
    monkeypatch.setattr(text_loaders, "load_austen", lambda: books)
    loaded = load_hf_folder(gpt2_folder)
    data = evaluation_data(loaded, "austen", max_length=MAX_LENGTH, examples=3)
    window = 4 * MAX_LENGTH  # characters per window: CHARACTERS_PER_TOKEN tokens each
    start = int(0.9 * 4000)
    first = books["book 0"][start : start + window]
    expected = loaded.tokenizer(first, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    assert data.task == "lm" and len(data.dataset) == 3
    assert data.dataset.tensors["input_ids"][0, : len(expected)].tolist() == expected
    labels = data.dataset.tensors["labels"][0]
    assert labels[: len(expected) - 1].tolist() == expected[1:] and int(labels[-1]) == -100


def test_diagnose_a_causal_lm_folder(pruned_gpt2, validation, tmp_path):
    _, out = pruned_gpt2
    summary = diagnose(out, "rt-sentences", tmp_path / "report", examples=8, max_length=MAX_LENGTH)
    payload = json.loads((tmp_path / "report" / "diagnostics.json").read_text())
    assert len(payload["layerwise_losses"]) == 3 and len(payload["rank_collapse"]) == 3
    # GPT-2 fuses Q, K and V in c_attn: split, they give each layer's spectra and norms.
    assert [row["layer"] for row in payload["spectra"]] == [
        "transformer.h.0.attn",
        "transformer.h.1.attn",
    ]
    assert len(payload["query_key_norms"]) == 2 and "skipped" not in summary.read_text()
    assert {"spectra.png", "query_key_norms.png"} <= set(payload["figures"])
    matrices = {row["name"]: row["sparsity"] for row in payload["weights"]["matrices"]}
    assert matrices["transformer.h.0.attn.c_attn.weight"] == pytest.approx(0.5, abs=1e-3)
    # The last layer-wise loss is the model's own loss: the final norm is applied once.
    model = load_sparse(out)
    batch = {key: value[:8] for key, value in validation.items()}
    assert math.exp(payload["layerwise_losses"][-1]) == pytest.approx(
        _perplexity(model, batch), rel=1e-4
    )


def test_diagnose_without_data_takes_what_the_folder_was_pruned_on(pruned_gpt2, tmp_path):
    _, out = pruned_gpt2  # pruned and scored on rt-sentences, not the causal LM default austen
    diagnose(out, None, tmp_path, examples=4, max_length=MAX_LENGTH)
    payload = json.loads((tmp_path / "diagnostics.json").read_text())
    assert payload["data"] == "rt-sentences"
    assert (
        "diagnosed on 'rt-sentences': the data it was scored on when pruned" in payload["notes"][0]
    )


def test_diagnose_a_classifier_folder(bert_folder, validation, tmp_path):
    from transformers import AutoModelForSequenceClassification

    diagnose(bert_folder, "rt-sentences", tmp_path, examples=8, max_length=MAX_LENGTH)
    payload = json.loads((tmp_path / "diagnostics.json").read_text())
    assert len(payload["spectra"]) == 2 and len(payload["query_key_norms"]) == 2
    for name in payload["figures"]:
        assert_drawn_figure(tmp_path / name)
    model = AutoModelForSequenceClassification.from_pretrained(bert_folder)
    inputs = {key: validation[key][:8] for key in ("input_ids", "attention_mask")}
    with torch.no_grad():
        loss = F.cross_entropy(model(**inputs).logits, validation["labels"][:8])
    assert payload["layerwise_losses"][-1] == pytest.approx(float(loss), rel=1e-4)


def test_cli_prunes_a_saved_folder(bert_folder, tmp_path, capsys):
    out = tmp_path / "pruned"
    argv = ["prune", str(bert_folder), "--sparsity", "0.5", "--examples", "8"]
    assert main([*argv, "--max-length", str(MAX_LENGTH), "--save", str(out), "--no-bench"]) == 0
    printed = capsys.readouterr().out
    assert "| dense |" in printed and f"pruned model and report: {out}" in printed
    written = (
        "pruning.json",
        "pruning.md",
        "pruning.png",
        "config.json",
        "sparse_model.safetensors",
    )
    for name in written:
        assert (out / name).is_file(), name
    assert_drawn_figure(out / "pruning.png")
    # The folder is never half written: a second run into it is refused.
    assert main([*argv, "--save", str(out)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err


def _one_sentence_error(argv, capsys) -> str:
    capsys.readouterr()  # drop what the test's own save_pretrained printed
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    return err


def test_broken_folders_give_one_sentence(gpt2_folder, tmp_path, capsys, tokenizer):
    from transformers import BertModel

    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes((gpt2_folder / "model.safetensors").read_bytes())
    assert "no config.json" in _one_sentence_error(["prune", str(no_config)], capsys)
    with pytest.raises(HFFolderError, match=r"no readable config\.json"):
        load_hf_folder(no_config)
    encoder = tmp_path / "encoder"
    BertModel(tiny_bert_config()).save_pretrained(encoder)
    tokenizer.save_pretrained(encoder)
    argv = ["diagnose", str(encoder), "--data", "rt-sentences", "--out", str(tmp_path / "d")]
    assert "holds a sentence encoder without a head" in _one_sentence_error(argv, capsys)
    head = tmp_path / "no-head-known"
    head.mkdir()
    config = json.loads((encoder / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**config, "architectures": ["BertPooler"]}))
    (head / "model.safetensors").write_bytes((encoder / "model.safetensors").read_bytes())
    tokenizer.save_pretrained(head)
    assert "architectures ['BertPooler'] are not supported" in _one_sentence_error(
        ["prune", str(head)], capsys
    )
    untokenized = tmp_path / "untokenized"
    untokenized.mkdir()
    for name in ("config.json", "model.safetensors"):
        (untokenized / name).write_bytes((gpt2_folder / name).read_bytes())
    assert "has no tokenizer" in _one_sentence_error(["prune", str(untokenized)], capsys)
    err = _one_sentence_error(["prune", str(gpt2_folder)], capsys)  # 64 tokens by default
    assert "--max-length 64 is out of range; it must be in [2, 32]" in err
    argv = ["prune", str(gpt2_folder), "--data", "digits", "--max-length", "16"]
    assert "--data digits is not text" in _one_sentence_error(argv, capsys)
