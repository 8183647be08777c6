"""The chunked linear cross-entropy against F.cross_entropy(F.linear(...)) and autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from convergent.losses import chunked_linear_cross_entropy
from convergent.models import Transformer, TransformerConfig
from convergent.train.primal_dual import descent_step

F64 = torch.float64


def _problem(bias: bool = True, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(11, 5, generator=generator, dtype=F64, requires_grad=True)
    weight = torch.randn(17, 5, generator=generator, dtype=F64, requires_grad=True)
    offset = torch.randn(17, generator=generator, dtype=F64, requires_grad=True) if bias else None
    targets = torch.randint(0, 17, (11,), generator=generator)
    targets[[2, 7]] = -100
    return features, weight, offset, targets


@pytest.mark.parametrize("chunk", [1, 3, 11, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_loss_and_gradients_equal_the_unchunked_cross_entropy(chunk, bias):
    features, weight, offset, targets = _problem(bias)
    want = F.cross_entropy(F.linear(features, weight, offset), targets, ignore_index=-100)
    inputs = [t for t in (features, weight, offset) if t is not None]
    want_grads = torch.autograd.grad(want * 1.7, inputs)
    got = chunked_linear_cross_entropy(features, weight, offset, targets, chunk_tokens=chunk)
    got_grads = torch.autograd.grad(got * 1.7, inputs)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=1e-7)
    for have, expected in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(have, expected, rtol=1e-5, atol=1e-7)


def test_without_gradients_it_only_computes_the_loss_and_validates_its_arguments():
    features, weight, offset, targets = _problem()
    with torch.no_grad():
        value = chunked_linear_cross_entropy(features, weight, offset, targets, chunk_tokens=4)
    want = F.cross_entropy(F.linear(features, weight, offset), targets, ignore_index=-100)
    assert value.item() == pytest.approx(want.item(), rel=1e-6) and not value.requires_grad
    every = torch.full_like(targets, -100)
    assert torch.isnan(chunked_linear_cross_entropy(features, weight, offset, every))
    with pytest.raises(ValueError, match="chunk_tokens is 0; it must be >= 1"):
        chunked_linear_cross_entropy(features, weight, offset, targets, chunk_tokens=0)
    with pytest.raises(ValueError, match=r"features must be \[N, d\] with targets \[N\]"):
        chunked_linear_cross_entropy(features, weight, offset, targets[:3])


def test_the_primal_dual_step_with_chunked_logits_gives_the_exact_losses_and_gradients():
    torch.manual_seed(0)
    config = TransformerConfig(task="lm", vocab_size=30, d_model=8, n_heads=2, n_layers=2,
                               max_len=12, causal=True)  # fmt: skip
    ids = torch.randint(0, 30, (3, 11))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    results = []
    for chunk in (None, 7):
        torch.manual_seed(1)  # the same model both times
        model = Transformer(config).double()
        step = descent_step("lm", 2, alpha=0.1, logit_chunk_tokens=chunk)
        losses, _, _ = step.layer_losses(model, batch)
        grads = torch.autograd.grad(losses.sum(), list(model.parameters()), allow_unused=True)
        results.append((losses.detach(), grads))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-6, atol=1e-7)
    for have, want in zip(results[1][1], results[0][1], strict=True):
        if want is None:
            assert have is None
        else:
            torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="logit_chunk_tokens is 4 for task 'classification'"):
        descent_step("classification", 2, logit_chunk_tokens=4)
