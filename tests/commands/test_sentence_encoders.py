"""``prune`` on a sentence encoder without a head (a ``BertModel`` sentence-transformers
folder): scored by the mean cosine of its pooled, normalised embeddings to the dense model's,
pooled as the folder's sentence-transformers config says."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from convergent.cli import main
from convergent.commands import load_sparse, prune_hf_folder
from convergent.commands.sentence_embeddings import pooling_mode
from tests.commands.conftest import EXAMPLES, MAX_LENGTH
from tests.conftest import tiny_bert_config

OPTIONS = {"data": "rt-sentences", "examples": EXAMPLES, "max_length": MAX_LENGTH,
           "calibration_examples": 8, "method": "wanda"}  # fmt: skip


def _encoder_folder(folder, tokenizer, pooling: str | None):
    from transformers import BertModel

    torch.manual_seed(0)
    BertModel(tiny_bert_config(vocab_size=len(tokenizer), max_position_embeddings=32)).save_pretrained(folder)  # fmt: skip
    tokenizer.save_pretrained(folder)
    if pooling is not None:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
        ]
        (folder / "modules.json").write_text(json.dumps(modules))
        (folder / "1_Pooling").mkdir()
        config = {f"pooling_mode_{key}": key.startswith(pooling)
                  for key in ("cls_token", "mean_tokens", "max_tokens")}  # fmt: skip
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return folder


def _expected_cosine(dense_folder, pruned_folder, validation, pooling: str) -> float:
    """The score written out here: both models' pooled, normalised embeddings, compared."""
    from transformers import BertModel

    dense = BertModel.from_pretrained(dense_folder).eval()
    pruned = load_sparse(pruned_folder).eval()
    ids, mask = validation["input_ids"], validation["attention_mask"]

    def embed(model):
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.double()
        if pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask.unsqueeze(-1).double()
            pooled = (hidden * weights).sum(1) / weights.sum(1)
        return F.normalize(pooled, dim=-1)

    return float((embed(dense) * embed(pruned)).sum(-1).mean())


@pytest.mark.parametrize("pooling", ["cls", None])  # None: no sentence-transformers files: mean
def test_a_sentence_encoder_is_scored_by_its_embeddings(pooling, tokenizer, validation, tmp_path):
    folder = _encoder_folder(tmp_path / "encoder", tokenizer, pooling)
    assert pooling_mode(folder) == (pooling or "mean")
    summary = prune_hf_folder(folder, (0.5,), save_to=tmp_path / "pruned", **OPTIONS)
    assert summary["kind"] == "sentence-embedding" and summary["metric"] == "embedding_cosine"
    assert summary["dense"] == {"embedding_cosine": pytest.approx(1.0, abs=1e-12)}
    (row,) = summary["rows"]
    expected = _expected_cosine(folder, tmp_path / "pruned", validation, pooling or "mean")
    assert row["embedding_cosine"] == pytest.approx(expected, abs=1e-6)
    assert 0.0 < row["embedding_cosine"] < 1.0
    if pooling is not None:  # the pruned folder is a sentence-transformers folder still
        copied = json.loads((tmp_path / "pruned" / "1_Pooling" / "config.json").read_text())
        assert copied["pooling_mode_cls_token"] is True
        assert (tmp_path / "pruned" / "modules.json").is_file()


def test_the_command_prints_the_embedding_fidelity(tokenizer, tmp_path, capsys):
    folder = _encoder_folder(tmp_path / "encoder", tokenizer, "mean")
    code = main(["prune", str(folder), "--method", "wanda", "--sparsity", "0.5", "--data",
                 "rt-sentences", "--examples", "4", "--max-length", "16",
                 "--calibration-examples", "8"])  # fmt: skip
    assert code == 0
    assert "| embedding_cosine |" in capsys.readouterr().out
    code = main(["prune", str(folder), "--low-memory", "--sparsity", "0.5", "--save",
                 str(tmp_path / "x"), "--data",
                 "rt-sentences", "--max-length", "16"])  # fmt: skip
    assert code == 2
    assert "leave out --low-memory" in capsys.readouterr().err
