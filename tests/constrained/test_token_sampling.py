"""Token sampling for the layer losses of a language model: unbiased estimates of the inner
layers' losses, the last layer exact, and dual ascent on the estimate converging to the
multipliers of the exact losses (worked out here from losses computed here)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from convergent.constrained import sample_tokens
from convergent.losses import IGNORE_INDEX
from convergent.models import Transformer, TransformerConfig
from convergent.train.primal_dual import descent_step

VOCAB, LAYERS = 40, 3


def _lm(seed: int = 0) -> tuple[Transformer, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    config = TransformerConfig(
        task="lm", vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=LAYERS, max_len=16,
        causal=True,
    )  # fmt: skip
    ids = torch.randint(0, VOCAB, (6, 13))
    labels = ids[:, 1:].clone()
    labels[0, -4:] = IGNORE_INDEX  # a padded tail: no target there
    return Transformer(config).eval(), {"input_ids": ids[:, :-1], "labels": labels}


def _exact_layer_losses(model: Transformer, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every layer's mean next-token cross-entropy over all targets, written out here."""
    with torch.no_grad():
        output = model(input_ids=batch["input_ids"], output_hidden_states=True)
        losses = []
        for hidden in output.hidden_states:
            logits = model.head(model.final_norm(hidden))
            losses.append(
                F.cross_entropy(
                    logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100
                )
            )
    return torch.stack(losses)


def test_sample_tokens_draws_targets_only_uniformly_and_refuses_bad_fractions():
    labels = torch.arange(20).reshape(4, 5)
    labels[1, 2:] = IGNORE_INDEX
    targets = {i for i in range(20) if labels.reshape(-1)[i] != IGNORE_INDEX}
    counts = torch.zeros(20)
    draws = 4000
    for seed in range(draws):
        chosen = sample_tokens(labels, 0.25, torch.Generator().manual_seed(seed), IGNORE_INDEX)
        assert len(chosen) == math.ceil(0.25 * 17) and set(chosen.tolist()) <= targets
        assert chosen.tolist() == sorted(set(chosen.tolist()))  # no repeats
        counts[chosen] += 1
    # Each target is kept with probability 5/17: binomial counts within 5 standard errors.
    p = 5 / 17
    spread = 5 * math.sqrt(draws * p * (1 - p))
    kept = counts[sorted(targets)]
    assert ((kept - draws * p).abs() <= spread).all() and counts.sum() == draws * 5
    with pytest.raises(ValueError, match=r"token_fraction is 0; it must be in \(0, 1\]"):
        sample_tokens(labels, 0, torch.Generator(), IGNORE_INDEX)


def test_sampled_inner_losses_are_unbiased_and_the_last_layer_stays_exact():
    model, batch = _lm()
    exact = _exact_layer_losses(model, batch)
    step = descent_step("lm", LAYERS, alpha=0.1, token_fraction=0.2, seed=1)
    estimates = []
    with torch.no_grad():
        for _ in range(600):
            losses, drawn, _ = step.layer_losses(model, batch)
            assert drawn is None
            assert losses[-1] == pytest.approx(exact[-1].item(), rel=1e-6)  # exact, always
            estimates.append(losses[:-1])
    estimates = torch.stack(estimates)
    mean, error = estimates.mean(0), estimates.std(0) / math.sqrt(len(estimates))
    assert (error > 0).all()  # the inner losses really were estimated from samples
    assert ((mean - exact[:-1]).abs() <= 4 * error).all(), (mean, exact, error)


def test_dual_ascent_on_the_estimate_reaches_the_exact_losses_multipliers():
    """A frozen model, resilient relaxation with cost c and u = lambda / c: the fixed point of
    lambda <- [lambda + eta (s - lambda / c)]_+ is lambda* = c s for s > 0, with
    s_l = f_l - (1 - alpha) f_{l-1} from the exact losses. The estimate's slacks are unbiased,
    so the multipliers fluctuate around the same lambda*."""
    model, batch = _lm(seed=2)
    alpha, cost = 0.3, 2.0
    f = _exact_layer_losses(model, batch)
    slacks = f[1:] - (1 - alpha) * f[:-1]
    assert (slacks > 0).all()  # the regime where the projection does not bind
    expected = cost * slacks
    tails = {}
    for fraction in (None, 0.25):
        step = descent_step("lm", LAYERS, alpha=alpha, dual_lr=0.05, resilient_cost=cost,
                            token_fraction=fraction, seed=3)  # fmt: skip
        tail = []
        for iteration in range(800):
            step.loss(model.train(), batch)  # records the slacks (a training-mode pass)
            step.after_optimizer_step(model)
            if iteration >= 400:
                tail.append(step.dual.value().clone())
        tails[fraction] = torch.stack(tail)
    torch.testing.assert_close(tails[None][-1], expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(tails[0.25].mean(0), expected, rtol=0.03, atol=0.0)
    assert (tails[0.25].std(0) > 0).all()  # it did run on noisy estimates


def test_token_fraction_is_for_language_models_only():
    with pytest.raises(ValueError, match=r"token_fraction is 0\.5 for task 'classification'"):
        descent_step("classification", 2, token_fraction=0.5)
    with pytest.raises(ValueError, match=r"token_fraction is 1.5; it must be in \(0, 1\]"):
        descent_step("lm", 2, token_fraction=1.5)
