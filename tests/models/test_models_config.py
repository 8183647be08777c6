"""TransformerConfig validation: each bad value gets a ValueError that names it."""

from __future__ import annotations

import dataclasses

import pytest

from convergent.models import TransformerConfig

BASE = {"vocab_size": 50, "d_model": 16, "n_heads": 2, "n_layers": 1}


def test_defaults_are_valid_and_derived_sizes() -> None:
    config = TransformerConfig(**BASE)
    assert config.feed_forward_dim == 64
    assert config.head_dim == 8
    assert TransformerConfig(**BASE, d_ff=24).feed_forward_dim == 24


def test_config_is_frozen_and_replace_revalidates() -> None:
    config = TransformerConfig(**BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.beta = 0.5  # type: ignore[misc]
    assert dataclasses.replace(config, beta=0.5).beta == 0.5
    with pytest.raises(ValueError, match="beta=2"):
        dataclasses.replace(config, beta=2.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_heads": 3}, r"n_heads=3 does not divide d_model=16"),
        ({"beta": -0.1}, r"beta=-0\.1 .*\[0, 1\]"),
        ({"beta": 1.5}, r"beta=1\.5 .*\[0, 1\]"),
        ({"norm": "layer"}, r"norm='layer'.*'pre', 'post', 'none'"),
        ({"task": "ranking"}, r"task='ranking'.*'classification'"),
        ({"pooling": "max"}, r"pooling='max'.*'cls', 'mean'"),
        ({"pooling": "token"}, r"pooling='token' is only allowed for task='regression'"),
        ({"dropout": 1.0}, r"dropout=1\.0 .*\[0, 1\)"),
        ({"dropout": -0.5}, r"dropout=-0\.5"),
        ({"d_model": 0}, r"d_model=0 .*>= 1"),
        ({"n_layers": 0}, r"n_layers=0 .*>= 1"),
        ({"max_len": -1}, r"max_len=-1 .*>= 1"),
        ({"num_outputs": 0}, r"num_outputs=0 .*>= 1"),
        ({"d_ff": 0}, r"d_ff=0 .*>= 1"),
        ({"n_heads": 2.0}, r"n_heads=2\.0 .*integer"),
        ({"activation": "swish"}, r"activation='swish'.*'gelu', 'relu'"),
        ({"init_std": 0.0}, r"init_std=0\.0 .*> 0"),
        ({"layer_norm_eps": 0.0}, r"layer_norm_eps=0\.0"),
        ({"tie_embeddings": True}, r"tie_embeddings=True needs task='lm'"),
        ({"input_dim": 4}, r"set exactly one"),
        ({"vocab_size": 0}, r"vocab_size=0 .*>= 1"),
    ],
)
def test_bad_values_raise_value_error_naming_them(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**{**BASE, **overrides})


def test_needs_one_input_kind_and_lm_needs_tokens() -> None:
    with pytest.raises(ValueError, match="set exactly one"):
        TransformerConfig(d_model=16, n_heads=2)
    with pytest.raises(ValueError, match="task='lm' needs token inputs"):
        TransformerConfig(input_dim=4, task="lm")
    with pytest.raises(ValueError, match="input_dim=0"):
        TransformerConfig(input_dim=0)


def test_lm_ignores_pooling_and_regression_allows_token_pooling() -> None:
    assert TransformerConfig(**BASE, task="lm", pooling="cls").task == "lm"
    assert TransformerConfig(**BASE, task="regression", pooling="token").pooling == "token"
