"""One-shot layer-wise pruning of language models: ours and transformers' GPT-2 (Conv1D, tied)."""

from __future__ import annotations

import logging

import pytest
import torch

from convergent.models import Transformer, TransformerConfig
from convergent.sparse import MaskSpec, perplexity, prune_one_shot


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    return GPT2LMHeadModel(config)


def _batches(vocab: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (4, 13), generator=generator)
    return [{"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}]


def test_gpt2_conv1d_layers_are_pruned_layer_wise_and_tied_embeddings_are_not(caplog):
    model = _gpt2()
    wte = model.transformer.wte.weight.detach().clone()
    with caplog.at_level(logging.INFO, logger="convergent.sparse.oneshot"):
        report = prune_one_shot(model, 0.6, spec=MaskSpec(include_first=True))
    # Every Conv1D weight (attention and MLP) loses exactly 60 % of its entries.
    assert len(report.masks) == 2 * 4
    parameters = dict(model.named_parameters())
    for name in report.masks:
        assert type(model.get_submodule(name.rsplit(".", 1)[0])).__name__ == "Conv1D"
        weight = parameters[name]
        assert int((weight == 0).sum()) == round(0.6 * weight.numel())
    assert report.sparsity == pytest.approx(0.6, abs=1e-3)
    # The tied input/output embedding is untouched, and the report and the log say so.
    assert torch.equal(model.transformer.wte.weight, wte)
    assert model.lm_head.weight is model.transformer.wte.weight
    note = next(line for line in report.notes if line.startswith("transformer.wte.weight"))
    assert "lm_head.weight" in note and "tied input/output embedding" in note
    assert "tied input/output embedding" in caplog.text


def test_gpt2_n_m_groups_run_along_conv1d_inputs():
    model = _gpt2()
    selection = MaskSpec().select(model)
    assert set(selection.input_dims.values()) == {0}
    report = prune_one_shot(model, 0.5, spec=MaskSpec(pattern="2:4"))
    for name, mask in report.masks.items():
        groups = mask.reshape(-1, 4, mask.shape[1])  # [in / 4, 4, out]: groups of inputs
        assert (groups.sum(dim=1) == 2).all(), name


def test_our_language_model_perplexity_before_and_after():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(
            task="lm", vocab_size=50, max_len=16, d_model=32, n_heads=4, n_layers=2, causal=True
        )
    )
    batches = _batches(50)
    before = perplexity(model, batches)
    assert 40 < before < 60  # near-uniform predictions at initialization: about the vocab size
    report = prune_one_shot(model, 0.9)
    assert "head.weight" in report.excluded and "token_embedding.weight" in report.excluded
    assert report.sparsity == pytest.approx(0.9, abs=1e-3)
    after = perplexity(model, batches)
    assert after != before


def test_perplexity_equals_transformers_own_loss():
    model = _gpt2().eval()  # no dropout in the reference either
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50, (4, 13), generator=generator)
    with torch.no_grad():
        expected = float(torch.exp(model(input_ids=tokens, labels=tokens).loss))
    batches = [{"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}]
    assert perplexity(model, batches) == pytest.approx(expected, rel=1e-5)
