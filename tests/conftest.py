"""Shared test fixtures: tiny models and datasets that need no downloads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

# The suite's models are tiny: on a 2-core machine a second intra-op thread only adds
# contention (a tiny step measured 0.35 s with 2 threads against 0.008 s with 1).
torch.set_num_threads(1)


class TinyClassifier(nn.Module):
    """A two-layer MLP with dropout whose forward returns an object with ``logits``."""

    def __init__(self, features: int = 6, classes: int = 3, dropout: float = 0.1) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, 16)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(16, classes)

    def forward(self, inputs: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.head(self.dropout(torch.tanh(self.hidden(inputs)))))


class TensorDataset(torch.utils.data.Dataset):
    """Dict-of-tensors dataset (the same surface as ``convergent.data.DictDataset``)."""

    def __init__(self, **tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[index] for key, value in self.tensors.items()}


class RecordingDataset(torch.utils.data.Dataset):
    """Wraps a dataset and remembers every index it served, in order.

    It has no ``tensors`` attribute, so the training loop and ``evaluate`` read it example by
    example, and a distributed test can check which examples each rank saw.
    """

    def __init__(self, base: torch.utils.data.Dataset) -> None:
        self.base = base
        self.served: list[int] = []

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.served.append(int(index))
        return self.base[index]


def assert_batches_split(single: list[int], ranks: list[list[int]], local: int) -> None:
    """Each global batch of a one-process run is split across the ranks, disjointly.

    Args:
        single: the indices the one-process run trained on, in order.
        ranks: the indices each rank trained on, in order.
        local: examples per rank per step.
    """
    world = len(ranks)
    steps = len(single) // (local * world)
    assert steps > 0 and len(single) == steps * local * world
    for served in ranks:
        assert len(served) == steps * local, "a rank trained on more or fewer examples"
    for step in range(steps):
        parts = [served[step * local : (step + 1) * local] for served in ranks]
        seen = [index for part in parts for index in part]
        assert len(set(seen)) == len(seen), f"step {step}: ranks share examples"
        glob = single[step * local * world : (step + 1) * local * world]
        assert sorted(seen) == sorted(glob), f"step {step}: the union is not the global batch"


def assert_examples_split(ranks: list[list[int]], size: int) -> None:
    """An evaluation pass over ``size`` examples: every rank read some, none twice, all read."""
    assert all(ranks), "a rank read no example: the set must be larger than batch x world"
    seen = [index for served in ranks for index in served]
    assert sorted(seen) == list(range(size))


def assert_drawn_figure(path) -> None:
    """``path`` is a PNG with something drawn on it: readable, not tiny, not one flat colour."""
    from matplotlib import image

    pixels = image.imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) >= 200, f"{path}: {pixels.shape}"
    assert float(pixels[..., :3].std()) > 0.02, f"{path} is blank"
    # more than a frame: at least 2 % of the pixels are neither white nor the most common colour
    assert float((pixels[..., :3] < 0.9).any(axis=-1).mean()) > 0.02, f"{path} is nearly empty"


def tiny_bert_config(**overrides):
    """A 2-layer, 16-wide BertConfig over 50 tokens (transformers is imported on call)."""
    from transformers import BertConfig

    settings = {
        "vocab_size": 50,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 16,
    }
    return BertConfig(**{**settings, **overrides})


def make_classification(n: int = 96, features: int = 6, classes: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, features, generator=generator)
    weights = torch.randn(features, classes, generator=generator)
    labels = (inputs @ weights).argmax(dim=1)
    return TensorDataset(inputs=inputs, labels=labels)


@pytest.fixture
def classification_data():
    return make_classification()


def tiny_regression_transformer(n_layers: int = 2) -> Any:
    """Our Transformer on [B, 5, 4] continuous inputs with 3 regression outputs (seeded)."""
    from convergent.models import Transformer, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(
        task="regression",
        input_dim=4,
        num_outputs=3,
        pooling="mean",
        d_model=8,
        n_heads=1,
        n_layers=n_layers,
        max_len=5,
    )
    return Transformer(config)


def tiny_lora_model() -> Any:
    """:func:`tiny_regression_transformer` with rank-2 LoRA on W_Q, W_K; B drawn non-zero."""
    from convergent.models.lora import add_query_key_lora, lora_parameters

    model = add_query_key_lora(tiny_regression_transformer(), rank=2)
    with torch.no_grad():  # PEFT starts B at zero; make the products non-zero for the tests
        for name, parameter in lora_parameters(model).items():
            if ".lora_B." in name:
                parameter.normal_(0, 0.5)
    return model


def assert_same_claims(rescored: Any, committed: Any, rel: float = 1e-6, where: str = "") -> None:
    """Committed claims, re-scored: verdicts, texts and structure equal; numbers equal within
    ``rel`` (a least-squares fit moves in its last digits between numpy/scipy releases)."""
    import math

    if isinstance(committed, dict):
        assert isinstance(rescored, dict) and rescored.keys() == committed.keys(), where
        for key in committed:
            assert_same_claims(rescored[key], committed[key], rel, f"{where}.{key}")
    elif isinstance(committed, list):
        assert isinstance(rescored, list) and len(rescored) == len(committed), where
        for index, (new, old) in enumerate(zip(rescored, committed, strict=True)):
            assert_same_claims(new, old, rel, f"{where}[{index}]")
    elif isinstance(committed, float):
        # a float stays a float (JSON writes 2.0 as 2.0): a verdict turned number, or a number
        # turned flag, fails here
        assert type(rescored) is float, f"{where}: {rescored!r} is not a float"
        same_nan = math.isnan(committed) and math.isnan(rescored)
        assert same_nan or math.isclose(rescored, committed, rel_tol=rel, abs_tol=0.0), (
            f"{where}: {rescored!r} != {committed!r}"
        )
    else:
        assert type(rescored) is type(committed) and rescored == committed, (
            f"{where}: {rescored!r} != {committed!r}"
        )


def copied(payload: Any) -> Any:
    """A deep copy of a study payload: pickled and read back, which copies what copy.deepcopy
    copies (same types, tuples kept, a shared object shared once) for about a tenth of its CPU
    on the results files of several megabytes that the summary tests copy once per claim."""
    import pickle

    return pickle.loads(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))


class RefusingTestSplit(torch.utils.data.Dataset):
    """A test split that fails on any use: selection runs must never read it."""

    def __len__(self) -> int:
        raise AssertionError("a selection run read the test split")

    def __getitem__(self, index):
        raise AssertionError("a selection run read the test split")

    def __getattr__(self, name):
        raise AssertionError(f"a selection run read the test split ({name})")


CLEAR_REFS = "/proc/self/clear_refs"


def status_bytes(field: str) -> int:
    """A field of /proc/self/status (``VmHWM``, ``VmRSS``) in bytes."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(f"{field}:"))
    return int(line.split()[1]) * 1024


# Tokenizing a text source whole is most of a command test's time: every prune or diagnose of
# a Hugging Face folder measured on rt-sentences tokenized its 10,568 sentences again (about
# 1.7 s of CPU a call, twice a prune: its validation and its calibration examples), for the
# same sentences and the same tokenizer. The suite tokenizes each (texts, tokenizer,
# max_length) once per process and hands out copies; a tokenizer that is not a fast (Rust)
# one, or anything the key cannot see, is tokenized as before.
_TOKENIZED: dict[tuple[Any, ...], dict[str, torch.Tensor]] = {}
# The init arguments that say where a tokenizer was read from: the files' content is its state.
_LOCATIONS = ("name_or_path", "vocab_file", "tokenizer_file")


def _tokenizer_key(tokenizer: Any) -> tuple[Any, ...] | None:
    """Everything of a fast tokenizer that its output depends on, or None (not memoized)."""
    import hashlib

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return None
    state = backend.to_str()
    # The state opens with "truncation" and "padding": transformers sets both from each call's
    # arguments (padding, truncation, max_length), so what a previous call left there changes
    # nothing of the next output. Everything from "added_tokens" on is the key.
    start = state.find('"added_tokens":')
    if not state.startswith('{"version":') or start < 0:
        return None
    return (
        type(tokenizer).__qualname__,
        hashlib.sha256(state[start:].encode()).hexdigest(),
        tokenizer.padding_side,
        tokenizer.truncation_side,
        tokenizer.pad_token,
        tokenizer.pad_token_id,
        tokenizer.pad_token_type_id,
        tuple(tokenizer.model_input_names),
        repr(sorted((k, v) for k, v in tokenizer.init_kwargs.items() if k not in _LOCATIONS)),
    )


@pytest.fixture(scope="session", autouse=True)
def _tokenize_each_text_source_once():
    from convergent.data import text_loaders

    tokenize = text_loaders.tokenize

    def memoized(texts, tokenizer, max_length):
        kind = _tokenizer_key(tokenizer)
        if kind is None:
            return tokenize(texts, tokenizer, max_length)
        key = (tuple(texts), kind, max_length)
        if key not in _TOKENIZED:
            _TOKENIZED[key] = tokenize(texts, tokenizer, max_length)
        return {name: value.clone() for name, value in _TOKENIZED[key].items()}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_loaders, "tokenize", memoized)
        yield
    _TOKENIZED.clear()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heaviest files first (see tests/heavy_files.py), each file's tests in their order."""
    from tests.heavy_files import heaviest_first

    keys = heaviest_first([item.nodeid.split("::")[0] for item in items])
    order = sorted(range(len(items)), key=keys.__getitem__)
    items[:] = [items[index] for index in order]
