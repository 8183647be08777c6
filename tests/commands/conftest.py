"""Tiny Hugging Face folders (built from configs, offline) shared by the command tests."""

from __future__ import annotations

import pytest
import torch

from convergent.data import load_splits, minilm_path
from tests.conftest import tiny_bert_config

MAX_LENGTH = 16
EXAMPLES = 12


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    # MiniLM's WordPiece tokenizer is cached offline; it serves the GPT-2 folder too.
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def validation(tokenizer):
    """The first rt-sentences validation examples, as the commands should tokenize them."""
    splits = load_splits("rt-sentences", seed=0, tokenizer=tokenizer, max_length=MAX_LENGTH)
    return {key: value[:EXAMPLES] for key, value in splits.validation.tensors.items()}


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=len(tokenizer),
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory, tokenizer):
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    config = tiny_bert_config(vocab_size=len(tokenizer), max_position_embeddings=32, num_labels=2)
    folder = tmp_path_factory.mktemp("bert")
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
