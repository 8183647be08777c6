"""Fixtures for convergent.data tests: a throwaway cache and a fake PyPI source."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
import torch

from convergent.data import recipes, sources
from convergent.data.recipes import Member, PypiArchive
from convergent.data.sources import DataSource

FAKE_CONTENT = b"the real content\n"


@pytest.fixture
def temporary_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point CONVERGENT_CACHE at an empty folder, so tests never touch the real cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CONVERGENT_CACHE", str(cache))
    return cache


class FakePip:
    """Stands in for ``pip download``: writes a small wheel and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.content = FAKE_CONTENT

    def __call__(self, requirement: str, kind: str, destination: Path) -> Path:
        self.calls += 1
        destination.mkdir(parents=True, exist_ok=True)
        wheel = destination / "fake_source-1.0-py3-none-any.whl"
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("fake_source/data/values.txt", self.content)
            archive.writestr("fake_source/__init__.py", "")
        wheel.write_bytes(buffer.getvalue())
        return wheel


@pytest.fixture
def fake_source(temporary_cache: Path, monkeypatch: pytest.MonkeyPatch) -> FakePip:
    """Register a source "fake" fetched by a fake pip; returns the fake pip."""
    fake_pip = FakePip()
    monkeypatch.setattr(recipes, "pip_download", fake_pip)
    source = DataSource(
        name="fake",
        description="a test source",
        recipe=PypiArchive(
            requirement="fake-source==1.0",
            kind="wheel",
            members=(Member(path=("fake_source/data/values.txt",), target="values.txt"),),
        ),
        files={"values.txt": hashlib.sha256(FAKE_CONTENT).hexdigest()},
    )
    monkeypatch.setitem(sources.SOURCES, "fake", source)
    return fake_pip


class WhitespaceTokenizer:
    """A tiny stand-in for a Hugging Face tokenizer: one id per distinct word, 0 = padding."""

    def __init__(self) -> None:
        self.vocabulary: dict[str, int] = {"[PAD]": 0}

    def __len__(self) -> int:
        return 1000

    def __call__(self, texts, padding, truncation, max_length, return_tensors):
        rows = []
        for text in texts:
            words = text.lower().split()[:max_length]
            ids = [
                self.vocabulary.setdefault(word, len(self.vocabulary)) % 999 + 1 for word in words
            ]
            rows.append(ids + [0] * (max_length - len(ids)))
        input_ids = torch.tensor(rows, dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}


@pytest.fixture
def whitespace_tokenizer() -> WhitespaceTokenizer:
    return WhitespaceTokenizer()


@pytest.fixture(scope="session")
def minilm_tokenizer():
    """MiniLM's tokenizer from the default cache (session scope: set up before any test
    points CONVERGENT_CACHE at an empty folder, so it is never downloaded twice)."""
    transformers = pytest.importorskip("transformers")
    from convergent.data import minilm_path

    return transformers.AutoTokenizer.from_pretrained(minilm_path())
