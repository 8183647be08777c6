from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from convergent.diagnostics import (
    SpectraRecorder,
    attention_spectra,
    condition_number,
    find_attention_sites,
    singular_value_extremes,
    singular_values,
)
from convergent.models import HFEncoder, Transformer, TransformerConfig
from tests.conftest import tiny_bert_config


def _ours(beta: float = 0.5, norm: str = "none", layers: int = 2) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        TransformerConfig(
            task="regression", num_outputs=3, input_dim=5, max_len=8, d_model=8, n_heads=2,
            n_layers=layers, beta=beta, norm=norm, init_std=0.3,
        )
    )  # fmt: skip


def _tiny_bert() -> HFEncoder:
    from transformers import BertModel

    torch.manual_seed(0)
    config = tiny_bert_config(attn_implementation="eager")
    return HFEncoder(BertModel(config, add_pooling_layer=False).eval())


@pytest.mark.parametrize("method", ["gram", "svd"])
@pytest.mark.parametrize("shape", [(6, 4), (4, 6)])  # T > d and T < d
def test_singular_value_extremes_match_numpy_on_the_kept_rows(method, shape):
    generator = torch.Generator().manual_seed(1)
    matrices = torch.randn(3, *shape, generator=generator, dtype=torch.float64)
    keep = torch.tensor([[1] * 4, [1] * 3 + [0], [1, 0, 1, 0]]).bool()
    if shape[0] == 6:
        keep = torch.cat([keep, torch.tensor([[1, 1], [0, 0], [1, 0]]).bool()], dim=1)
    low, high = singular_value_extremes(matrices, keep, method=method)
    for b in range(3):
        expected = np.linalg.svd(matrices[b][keep[b]].numpy(), compute_uv=False)
        assert low[b].item() == pytest.approx(expected.min(), rel=1e-9)
        assert high[b].item() == pytest.approx(expected.max(), rel=1e-9)
    # Rank one: sigma_min is zero (to the method's resolution) and sigma_max exact.
    rank_one = torch.ones(1, 5, 3, dtype=torch.float64)
    low, high = singular_value_extremes(rank_one, method=method)
    assert low.item() == pytest.approx(0.0, abs=1e-7 * np.sqrt(15))
    assert high.item() == pytest.approx(np.sqrt(15))


def test_fast_gram_path_equals_the_svd_reference_in_float32():
    generator = torch.Generator().manual_seed(2)
    matrices = torch.randn(8, 16, 32, generator=generator) * torch.logspace(-3, 0, 32)
    torch.testing.assert_close(
        singular_values(matrices, "gram"), singular_values(matrices, "svd"), rtol=1e-4, atol=1e-6
    )
    with pytest.raises(ValueError, match="method='qr' is not supported"):
        singular_values(matrices, "qr")
    assert torch.isinf(condition_number(torch.zeros(1), torch.ones(1))).all()


def test_spectra_of_our_transformer_match_a_direct_computation():
    model = _ours(beta=0.5).eval()
    inputs = torch.randn(4, 8, 5)
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3, [1] * 8, [1] * 3 + [0] * 5])
    spectra = attention_spectra(model, {"inputs": inputs, "attention_mask": mask})
    assert spectra.layer_names == ("blocks.0.attention", "blocks.1.attention")
    assert spectra.sigma_min.shape == (2, 4)
    with torch.no_grad():
        hidden = model.embed(inputs=inputs)
        allowed = mask.bool()[:, None, None, :]
        attention = model.blocks[0].attention(hidden, allowed)
    expected_low, expected_high = singular_value_extremes(attention, mask.bool())
    torch.testing.assert_close(spectra.sigma_min[0], expected_low)
    torch.testing.assert_close(spectra.sigma_max[0], expected_high)
    residual_low, residual_high = singular_value_extremes(0.5 * hidden + attention, mask.bool())
    torch.testing.assert_close(spectra.residual_sigma_min[0], residual_low)
    torch.testing.assert_close(spectra.residual_sigma_max[0], residual_high)
    torch.testing.assert_close(spectra.condition, spectra.sigma_max / spectra.sigma_min)
    assert spectra.betas == (0.5, 0.5)
    # An explicit beta overrides the model's.
    plain = attention_spectra(model, {"inputs": inputs, "attention_mask": mask}, beta=0.0)
    torch.testing.assert_close(plain.residual_sigma_min, plain.sigma_min)


def test_pre_norm_residual_uses_the_block_input_not_the_normalised_one():
    model = _ours(beta=1.0, norm="pre", layers=1).eval()
    inputs = torch.randn(2, 8, 5)
    spectra = attention_spectra(model, {"inputs": inputs})
    with torch.no_grad():
        hidden = model.embed(inputs=inputs)
        block = model.blocks[0]
        attention = block.attention(block.attention_norm(hidden))
    low, _ = singular_value_extremes(hidden + attention)
    torch.testing.assert_close(spectra.residual_sigma_min[0], low)


def test_spectra_of_a_bert_encoder_match_a_direct_computation():
    model = _tiny_bert()
    input_ids = torch.randint(1, 50, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 7])
    spectra = attention_spectra(model, {"input_ids": input_ids, "attention_mask": mask})
    assert spectra.layer_names == (
        "encoder.encoder.layer.0.attention",
        "encoder.encoder.layer.1.attention",
    )
    with torch.no_grad():
        hidden = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        layer = model.encoder.encoder.layer[1]
        x = hidden.hidden_states[1]
        additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        context = layer.attention.self(x, attention_mask=additive)[0]
        attention = layer.attention.output.dense(context)
    low, high = singular_value_extremes(attention, mask.bool())
    torch.testing.assert_close(spectra.sigma_min[1], low, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(spectra.sigma_max[1], high, rtol=1e-4, atol=1e-5)
    residual_low, _ = singular_value_extremes(x + attention, mask.bool())
    torch.testing.assert_close(spectra.residual_sigma_min[1], residual_low, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_train_or_eval_mode_is_left_as_it_was(training):
    model = _ours()
    model.train(training)
    attention_spectra(model, {"inputs": torch.randn(2, 8, 5)})
    assert all(module.training == training for module in model.modules())


def test_recorder_samples_every_k_forward_passes_and_detaches():
    model = _ours()
    seen = []
    recorder = SpectraRecorder(model, every=3, on_record=lambda index, _: seen.append(index))
    with recorder:
        for _ in range(7):
            loss = model(inputs=torch.randn(2, 8, 5)).logits.sum()
            loss.backward()  # hooks must not break autograd
    assert [index for index, _ in recorder.records] == [0, 3, 6] == seen
    model(inputs=torch.randn(2, 8, 5))  # detached: no more records
    assert len(recorder.records) == 3
    assert all(p.grad is not None for p in model.blocks[0].attention.q_proj.parameters())


def test_models_without_attention_get_an_error_listing_module_types():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with pytest.raises(ValueError, match=r"module types seen: Linear, ReLU, Sequential"):
        find_attention_sites(model)
    with pytest.raises(ValueError, match=r"every=0 is out of range"):
        SpectraRecorder(_ours(), every=0)
