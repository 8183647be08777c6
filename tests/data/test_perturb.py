from __future__ import annotations

import math

import pytest
import torch

from convergent.data.perturb import (
    embedding_rms,
    perturb_token_embeddings,
    perturbed_embeddings,
    word_embedding,
)
from convergent.models import HFEncoder, Transformer, TransformerConfig
from tests.conftest import tiny_bert_config


@pytest.fixture
def weight():
    return torch.randn(50, 32, generator=torch.Generator().manual_seed(0)) * 0.3


def _ids(shape=(64, 40)):
    return torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["gaussian", "uniform"])
def test_additive_noise_has_rms_gamma_times_the_embedding_rms(weight, kind):
    ids = _ids()
    clean = weight[ids]
    noisy = perturb_token_embeddings(
        clean, ids, weight, kind, 0.5, torch.Generator().manual_seed(2)
    )
    noise = noisy - clean
    rms = embedding_rms(weight)
    assert float(noise.pow(2).mean().sqrt()) == pytest.approx(0.5 * rms, rel=0.02)
    if kind == "uniform":
        assert float(noise.abs().max()) <= 0.5 * rms * math.sqrt(3) + 1e-6


def test_discrete_replaces_a_gamma_fraction_by_other_token_embeddings(weight):
    ids = _ids()
    clean = weight[ids]
    noisy = perturb_token_embeddings(
        clean, ids, weight, "discrete", 0.3, torch.Generator().manual_seed(3)
    )
    changed = (noisy != clean).any(dim=-1)
    # a replacement by the same token is invisible: expected fraction 0.3 * (1 - 1 / 50)
    assert float(changed.float().mean()) == pytest.approx(0.3 * 49 / 50, abs=0.02)
    distances = torch.cdist(noisy[changed], weight, compute_mode="donot_use_mm_for_euclid_dist")
    assert float(distances.min(dim=1).values.max()) < 1e-5  # every new row is a row of W


@pytest.mark.parametrize("kind", ["gaussian", "uniform", "discrete"])
def test_gamma_zero_and_skipped_tokens_are_untouched(weight, kind):
    ids = _ids()
    clean = weight[ids]
    assert perturb_token_embeddings(clean, ids, weight, kind, 0.0) is clean
    noisy = perturb_token_embeddings(clean, ids, weight, kind, 0.9, skip_token_ids=[3, 7])
    skipped = (ids == 3) | (ids == 7)
    assert bool(skipped.any())
    torch.testing.assert_close(noisy[skipped], clean[skipped])
    assert bool((noisy[~skipped] != clean[~skipped]).any())


def test_bad_levels_are_rejected(weight):
    ids = _ids((2, 3))
    with pytest.raises(ValueError, match=r"gamma is -0\.1; it must be a finite number >= 0"):
        perturb_token_embeddings(weight[ids], ids, weight, "gaussian", -0.1)
    with pytest.raises(ValueError, match=r"gamma is 1.5; a replacement probability"):
        perturb_token_embeddings(weight[ids], ids, weight, "discrete", 1.5)
    with pytest.raises(ValueError, match="perturbation must be one of"):
        perturb_token_embeddings(weight[ids], ids, weight, "salt", 0.1)


def test_the_context_manager_perturbs_our_transformer_and_then_restores_it():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=50, num_outputs=2, d_model=16, n_heads=2))
    model.eval()
    ids = _ids((4, 10))
    clean = model(input_ids=ids).logits
    with perturbed_embeddings(model, "gaussian", 1.0, seed=5) as module:
        assert module is model.token_embedding
        first = model(input_ids=ids).logits
    with perturbed_embeddings(model, "gaussian", 1.0, seed=5):
        again = model(input_ids=ids).logits
    torch.testing.assert_close(first, again)  # the seed makes it reproducible
    assert not torch.allclose(first, clean)
    torch.testing.assert_close(model(input_ids=ids).logits, clean)


def test_the_context_manager_finds_the_word_embeddings_of_a_hugging_face_encoder():
    from transformers import BertModel

    config = tiny_bert_config()
    model = HFEncoder(BertModel(config, add_pooling_layer=False)).eval()
    assert word_embedding(model) is model.encoder.embeddings.word_embeddings
    ids = _ids((3, 8))
    clean = model(input_ids=ids).logits
    with perturbed_embeddings(model, "discrete", 1.0, seed=0):
        noisy = model(input_ids=ids).logits
    assert not torch.allclose(noisy, clean)
    torch.testing.assert_close(model(input_ids=ids).logits, clean)
    with pytest.raises(ValueError, match="has no token embedding"):
        word_embedding(torch.nn.Linear(2, 2))
