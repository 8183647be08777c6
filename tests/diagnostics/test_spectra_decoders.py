"""Attention spectra and W_Q/W_K norms of the decoders we advertise: GPT-2 (Q, K and V fused in
one ``c_attn``) and Llama-style models (grouped-query attention), tiny and random, built from
their config classes. Expected values are computed here from each model's own modules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from convergent.diagnostics import attention_spectra, query_key_norms, singular_value_extremes

TOKENS = 7
MASK = torch.tensor([[1] * TOKENS, [1] * 4 + [0] * 3, [1] * TOKENS])  # right padding


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2, attn_implementation="eager"
    )
    return GPT2LMHeadModel(config).eval()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        attn_implementation="eager",
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _additive_mask() -> torch.Tensor:
    """Causal and padding, [B, 1, T, T], 0 where allowed and the float minimum elsewhere."""
    causal = torch.tril(torch.ones(TOKENS, TOKENS, dtype=torch.bool))
    allowed = causal[None, None] & MASK.bool()[:, None, None, :]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def _gpt2_attention(model, block, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's attention output written out: split the fused projection, attend per head,
    merge and project."""
    heads, width = block.attn.num_heads, x.shape[-1]
    q, k, v = block.attn.c_attn(block.ln_1(x)).split(width, dim=2)

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], TOKENS, heads, width // heads).transpose(1, 2)

    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(width // heads)
    weights = torch.softmax(scores + _additive_mask(), dim=-1)
    context = (weights @ split(v)).transpose(1, 2).reshape(x.shape)
    return block.attn.c_proj(context)


def _llama_attention(model, layer, x: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(TOKENS)[None].expand(x.shape[0], -1)
    rotary = model.model.rotary_emb(x, positions)
    normed = layer.input_layernorm(x)
    return layer.self_attn(normed, position_embeddings=rotary, attention_mask=_additive_mask())[0]


def _assert_spectra(spectra, index: int, x: torch.Tensor, attention: torch.Tensor) -> None:
    keep = MASK.bool()
    low, high = singular_value_extremes(attention, keep)
    torch.testing.assert_close(spectra.sigma_min[index], low, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(spectra.sigma_max[index], high, rtol=1e-4, atol=1e-5)
    # The residual branch adds the block's input, the residual stream (not its normed copy).
    residual_low, residual_high = singular_value_extremes(x + attention, keep)
    torch.testing.assert_close(
        spectra.residual_sigma_min[index], residual_low, rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        spectra.residual_sigma_max[index], residual_high, rtol=1e-4, atol=1e-5
    )


# (model, its layers, the attention output of one layer given its input X, the layers' names)
DECODERS = {
    "gpt2": (_gpt2, lambda model: model.transformer.h, _gpt2_attention, "transformer.h.{}.attn"),
    "llama": (
        _llama,
        lambda model: model.model.layers,
        _llama_attention,
        "model.layers.{}.self_attn",
    ),
}


@pytest.mark.parametrize("decoder", DECODERS)
def test_decoder_spectra_read_the_residual_stream(decoder):
    build, layers, attend, name = DECODERS[decoder]
    model = build()
    input_ids = torch.randint(0, 50, (3, TOKENS))
    spectra = attention_spectra(model, {"input_ids": input_ids, "attention_mask": MASK})
    assert spectra.layer_names == (name.format(0), name.format(1))
    with torch.no_grad():
        hidden = model(input_ids=input_ids, attention_mask=MASK, output_hidden_states=True)
        for index, layer in enumerate(layers(model)):
            x = hidden.hidden_states[index]
            _assert_spectra(spectra, index, x, attend(model, layer, x))


def _spectral(matrix: torch.Tensor) -> float:
    return float(np.linalg.norm(matrix.double().numpy(), ord=2))


def test_gpt2_query_key_norms_come_from_the_split_c_attn():
    model = _gpt2()
    rows = query_key_norms(model)
    assert [row["layer"] for row in rows] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    for row, block in zip(rows, model.transformer.h, strict=True):
        fused = block.attn.c_attn.weight.detach()  # [in, 3 * width]: x @ W
        query, key = fused[:, :16], fused[:, 16:32]  # [in, out]
        assert row["query_frobenius"] == pytest.approx(float(query.norm()), rel=1e-5)
        assert row["key_frobenius"] == pytest.approx(float(key.norm()), rel=1e-5)
        assert row["query_spectral"] == pytest.approx(_spectral(query), rel=1e-4)
        # logits: x W_q (x W_k)^T = x (W_q W_k^T) x^T
        assert row["query_key_spectral"] == pytest.approx(_spectral(query @ key.T), rel=1e-4)


def test_llama_query_key_norms_pair_each_query_head_with_its_key_head():
    model = _llama()
    rows = query_key_norms(model)
    assert [row["layer"] for row in rows] == [
        "model.layers.0.self_attn",
        "model.layers.1.self_attn",
    ]
    head_dim, heads, groups = 4, 4, 2
    for row, layer in zip(rows, model.model.layers, strict=True):
        w_q = layer.self_attn.q_proj.weight.detach()  # [heads * head_dim, in]
        w_k = layer.self_attn.k_proj.weight.detach()  # [key heads * head_dim, in]
        # sum over query heads h of W_q,h^T W_k,h // groups: what the logits of all heads add
        product = sum(
            w_q[h * head_dim : (h + 1) * head_dim].T
            @ w_k[(h // groups) * head_dim : (h // groups + 1) * head_dim]
            for h in range(heads)
        )
        assert row["key_frobenius"] == pytest.approx(float(w_k.norm()), rel=1e-5)
        assert row["query_key_spectral"] == pytest.approx(_spectral(product), rel=1e-4)
