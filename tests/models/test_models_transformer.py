"""Transformer: shapes, the shared readout, masking, the block formulas, hooks and names."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convergent.models import ModelOutput, Transformer, TransformerConfig

VOCAB = 23
INPUT_DIM = 5
BATCH, LENGTH = 3, 7


def make_model(**overrides) -> Transformer:
    settings = {"d_model": 16, "n_heads": 4, "n_layers": 2, "max_len": 12, "num_outputs": 3}
    if "input_dim" not in overrides:
        settings["vocab_size"] = VOCAB
    torch.manual_seed(0)
    return Transformer(TransformerConfig(**{**settings, **overrides}))


def make_inputs(model: Transformer, length: int = LENGTH, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    if model.config.vocab_size is not None:
        return {"input_ids": torch.randint(0, VOCAB, (BATCH, length), generator=generator)}
    return {"inputs": torch.randn(BATCH, length, INPUT_DIM, generator=generator)}


SETTINGS = [
    (task, pooling, norm, causal, kind)
    for task, pooling in [
        ("classification", "cls"),
        ("classification", "mean"),
        ("classification", "last"),
        ("regression", "cls"),
        ("regression", "mean"),
        ("regression", "token"),
        ("lm", "cls"),
    ]
    for norm, causal, kind in itertools.product(
        ["pre", "post", "none"], [False, True], ["tokens", "features"]
    )
    if not (task == "lm" and kind == "features")
]


@pytest.mark.parametrize(("task", "pooling", "norm", "causal", "kind"), SETTINGS)
def test_shapes_hidden_states_and_readout_parity(
    task: str, pooling: str, norm: str, causal: bool, kind: str
) -> None:
    extra = {"input_dim": INPUT_DIM} if kind == "features" else {}
    model = make_model(task=task, pooling=pooling, norm=norm, causal=causal, **extra)
    batch = make_inputs(model)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[0, 5:] = 0
    out = model(**batch, attention_mask=mask, output_hidden_states=True)

    assert isinstance(out, ModelOutput)
    expected = {
        "classification": (BATCH, 3),
        "regression": (BATCH, LENGTH, 3) if pooling == "token" else (BATCH, 3),
        "lm": (BATCH, LENGTH, VOCAB),
    }[task]
    assert out.logits.shape == expected
    assert out.hidden_states is not None
    assert len(out.hidden_states) == model.num_layers + 1 == 3
    assert all(h.shape == (BATCH, LENGTH, 16) for h in out.hidden_states)
    assert torch.isfinite(out.logits).all()
    assert torch.equal(model.readout(out.hidden_states[-1], mask), out.logits)
    # every layer can be read out by the same head
    assert model.readout(out.hidden_states[0], mask).shape == expected
    assert model(**batch, attention_mask=mask).hidden_states is None
    assert model.task == task
    assert model.hidden_size == 16


def test_final_norm_only_with_pre_norm() -> None:
    assert isinstance(make_model(norm="pre").final_norm, nn.LayerNorm)
    assert isinstance(make_model(norm="post").final_norm, nn.Identity)
    assert isinstance(make_model(norm="none").final_norm, nn.Identity)
    assert not any(isinstance(m, nn.LayerNorm) for m in make_model(norm="none").modules())


@pytest.mark.parametrize("norm", ["pre", "post", "none"])
def test_causal_future_tokens_do_not_change_past_logits(norm: str) -> None:
    model = make_model(task="lm", causal=True, norm=norm)
    ids = make_inputs(model)["input_ids"]
    changed = ids.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % VOCAB
    before, after = model(input_ids=ids).logits, model(input_ids=changed).logits
    torch.testing.assert_close(before[:, :4], after[:, :4], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 4:], after[:, 4:])


def test_encoder_sees_future_tokens() -> None:
    model = make_model(task="lm", causal=False)
    ids = make_inputs(model)["input_ids"]
    changed = ids.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % VOCAB
    assert not torch.allclose(
        model(input_ids=ids).logits[:, :4], model(input_ids=changed).logits[:, :4]
    )


@pytest.mark.parametrize(
    ("norm", "causal"), list(itertools.product(["pre", "post", "none"], [False, True]))
)
def test_padding_does_not_change_real_tokens(norm: str, causal: bool) -> None:
    model = make_model(norm=norm, causal=causal, pooling="mean", task="regression")
    ids = make_inputs(model, length=5)["input_ids"]
    padded = torch.cat([ids, torch.randint(0, VOCAB, (BATCH, 3))], dim=1)
    mask = torch.cat([torch.ones(BATCH, 5), torch.zeros(BATCH, 3)], dim=1).long()
    short = model(input_ids=ids, output_hidden_states=True)
    long = model(input_ids=padded, attention_mask=mask, output_hidden_states=True)
    for h_short, h_long in zip(short.hidden_states, long.hidden_states, strict=True):
        torch.testing.assert_close(h_short, h_long[:, :5], rtol=0, atol=1e-6)
    torch.testing.assert_close(short.logits, long.logits, rtol=0, atol=1e-6)
    # without the mask the padding would leak in (encoder) or into the mean (both)
    unmasked = model(input_ids=padded).logits
    assert not torch.allclose(short.logits, unmasked, atol=1e-4)


def test_bool_and_long_masks_agree_and_left_padding_is_finite() -> None:
    model = make_model(task="lm", causal=True)
    ids = make_inputs(model)["input_ids"]
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[:, :2] = 0  # left padding: the first queries have no allowed key
    long_mask = model(input_ids=ids, attention_mask=mask).logits
    bool_mask = model(input_ids=ids, attention_mask=mask.bool()).logits
    assert torch.equal(long_mask, bool_mask)
    assert torch.isfinite(long_mask).all()


def test_attention_matches_scaled_dot_product_attention_in_float64() -> None:
    model = make_model(causal=True).double()
    attention = model.blocks[0].attention
    x = torch.randn(BATCH, LENGTH, 16, dtype=torch.float64)
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 5:] = False
    allowed = (
        torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]
    )

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(BATCH, LENGTH, 4, 4).transpose(1, 2)

    reference = F.scaled_dot_product_attention(
        heads(attention.q_proj(x)),
        heads(attention.k_proj(x)),
        heads(attention.v_proj(x)),
        attn_mask=allowed,
    )
    reference = attention.o_proj(reference.transpose(1, 2).reshape(BATCH, LENGTH, 16))
    torch.testing.assert_close(attention(x, allowed), reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("norm", ["pre", "post", "none"])
def test_block_follows_the_residual_formula(beta: float, norm: str) -> None:
    model = make_model(beta=beta, norm=norm, n_layers=1, causal=True).double()
    block = model.blocks[0]
    x = torch.randn(BATCH, LENGTH, 16, dtype=torch.float64)
    allowed = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()[None, None]
    attn, ffn = block.attention, block.feed_forward
    if norm == "pre":
        y = beta * x + attn(block.attention_norm(x), allowed)
        z = beta * y + ffn(block.feed_forward_norm(y))
    elif norm == "post":
        y = block.attention_norm(beta * x + attn(x, allowed))
        z = block.feed_forward_norm(beta * y + ffn(y))
    else:
        y = beta * x + attn(x, allowed)
        z = beta * y + ffn(y)
    torch.testing.assert_close(block(x, allowed), z, rtol=0, atol=1e-12)


def test_beta_zero_without_norm_is_ffn_of_attention() -> None:
    model = make_model(beta=0.0, norm="none", n_layers=1, input_dim=INPUT_DIM, task="regression")
    out = model(**make_inputs(model), output_hidden_states=True)
    x = out.hidden_states[0]
    block = model.blocks[0]
    torch.testing.assert_close(
        out.hidden_states[1], block.feed_forward(block.attention(x)), rtol=0, atol=0
    )
    assert torch.isfinite(out.logits).all()


def test_hooks_see_attention_output_and_weights() -> None:
    model = make_model()
    seen: dict[str, torch.Tensor] = {}
    attention = model.blocks[1].attention
    attention.register_forward_hook(lambda m, i, o: seen.__setitem__("output", o))
    attention.attention_weights.register_forward_hook(
        lambda m, i, o: seen.__setitem__("weights", o)
    )
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[2, 4:] = 0
    out = model(**make_inputs(model), attention_mask=mask, output_hidden_states=True)
    assert seen["output"].shape == (BATCH, LENGTH, 16)
    assert seen["weights"].shape == (BATCH, 4, LENGTH, LENGTH)
    torch.testing.assert_close(seen["weights"].sum(-1), torch.ones(BATCH, 4, LENGTH))
    assert torch.all(seen["weights"][2, :, :, 4:] == 0)
    # pre-norm block, beta = 1: Y = X + Attn(LN(X)), and the hook saw exactly Attn(LN(X))
    block = model.blocks[1]
    y = out.hidden_states[1] + seen["output"]
    torch.testing.assert_close(
        out.hidden_states[2], y + block.feed_forward(block.feed_forward_norm(y))
    )


def test_lora_friendly_names() -> None:
    model = make_model(n_layers=3)
    names = dict(model.named_modules())
    for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
        matching = [name for name in names if name.endswith("." + projection)]
        assert len(matching) == 3
        assert all(isinstance(names[name], nn.Linear) for name in matching)
    assert model.attention_projection_names["query"] == "q_proj"
    assert "blocks.0.attention.q_proj.weight" in dict(model.named_parameters())


def test_peft_lora_wraps_attention_projections() -> None:
    peft = pytest.importorskip("peft")
    model = make_model()
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "k_proj"]))
    trainable = [name for name, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_tied_embeddings_share_storage_and_survive_state_dict() -> None:
    model = make_model(task="lm", tie_embeddings=True, causal=True)
    assert model.head.weight is model.token_embedding.weight
    assert model.head.bias is None
    copy = make_model(task="lm", tie_embeddings=True, causal=True, init_std=0.5)
    copy.load_state_dict(model.state_dict())
    ids = make_inputs(model)["input_ids"]
    assert torch.equal(copy(input_ids=ids).logits, model(input_ids=ids).logits)
    assert copy.head.weight is copy.token_embedding.weight


def test_initialisation_is_normal_with_init_std() -> None:
    model = make_model(d_model=64, n_heads=4, init_std=0.02)
    weight = model.blocks[0].attention.q_proj.weight
    assert abs(weight.std().item() - 0.02) < 0.002
    assert torch.all(model.blocks[0].attention.q_proj.bias == 0)
    assert torch.all(model.blocks[0].attention_norm.weight == 1)


def test_dropout_is_active_in_train_mode_only() -> None:
    model = make_model(dropout=0.3)
    batch = make_inputs(model)
    assert not torch.equal(model(**batch).logits, model(**batch).logits)
    model.eval()
    assert torch.equal(model(**batch).logits, model(**batch).logits)
    assert torch.equal(
        make_model(dropout=0.0)(**batch).logits, make_model(dropout=0.0)(**batch).logits
    )


def test_gradients_match_finite_differences_in_float64() -> None:
    model = make_model(
        input_dim=INPUT_DIM, d_model=8, n_heads=2, n_layers=1, task="regression", pooling="mean"
    ).double()
    inputs = torch.randn(2, 4, INPUT_DIM, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert torch.autograd.gradcheck(
        lambda x: model(inputs=x, attention_mask=mask).logits, (inputs,)
    )


def test_forward_errors_are_clear() -> None:
    tokens = make_model()
    features = make_model(input_dim=INPUT_DIM)
    ids = torch.zeros(BATCH, LENGTH, dtype=torch.long)
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        tokens()
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        tokens(input_ids=ids, inputs=torch.zeros(BATCH, LENGTH, INPUT_DIM))
    with pytest.raises(ValueError, match="inputs was given"):
        tokens(inputs=torch.zeros(BATCH, LENGTH, INPUT_DIM))
    with pytest.raises(ValueError, match="input_ids was given"):
        features(input_ids=ids)
    with pytest.raises(ValueError, match=r"expected \[B, T, 5\]"):
        features(inputs=torch.zeros(BATCH, LENGTH, 4))
    with pytest.raises(ValueError, match=r"sequence length 13 .*\[1, 12\]"):
        tokens(input_ids=torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        tokens(input_ids=ids, attention_mask=torch.ones(BATCH, LENGTH + 1))


def test_model_learns_a_tiny_task() -> None:
    """A few Adam steps fit a learnable rule, so gradients reach every part of the model."""
    model = make_model(task="classification", num_outputs=2, pooling="mean", n_layers=1)
    ids = torch.randint(0, VOCAB, (32, 6), generator=torch.Generator().manual_seed(3))
    labels = (ids < VOCAB // 2).sum(dim=1).gt(3).long()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(25):
        loss = F.cross_entropy(model(input_ids=ids).logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert losses[0] == pytest.approx(math.log(2), abs=0.1)
