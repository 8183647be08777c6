from __future__ import annotations

import json
import math

import pytest
import torch

from convergent.studies.common import write_study
from convergent.studies.residual import Config, run
from convergent.studies.residual_depth import ScaledResidualOutput, set_residual_coefficient


def _tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=8, hidden_dropout_prob=0.0,
    )  # fmt: skip
    return BertModel(config, add_pooling_layer=False).eval()


def test_scaled_residual_at_beta_one_is_bert_and_at_zero_drops_the_input():
    model = _tiny_bert()
    ids = torch.randint(0, 30, (2, 5))
    reference = model(input_ids=ids).last_hidden_state
    assert set_residual_coefficient(model, 1.0) == 4
    torch.testing.assert_close(model(input_ids=ids).last_hidden_state, reference)
    assert {n for n, _ in model.named_parameters()} == {
        n for n, _ in _tiny_bert().named_parameters()
    }
    set_residual_coefficient(model, 0.0)
    output = model.encoder.layer[0].attention.output
    assert isinstance(output, ScaledResidualOutput) and output.beta == 0.0
    h, x = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    torch.testing.assert_close(output(h, x), output.LayerNorm(output.dense(h)))
    assert not torch.allclose(model(input_ids=ids).last_hidden_state, reference)


def test_config_modes_and_bad_values():
    assert Config.for_mode("full").seeds == (0, 1, 2)
    assert Config.for_mode("quick").betas == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert Config.for_mode("quick").depths == (2, 6, 10)
    with pytest.raises(ValueError, match=r"beta=1.5 is out of range"):
        Config(betas=(0.0, 1.5))
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")


def test_smoke_run_writes_a_report(tmp_path):
    result = run(Config.for_mode("smoke"), tmp_path, progress=False)
    report = write_study(result, tmp_path)
    assert report.is_file()
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["name"] == "residual"
    assert len(result.claims) == 5
    assert all(claim.reproduced is None for claim in result.claims)  # smoke decides nothing
    for figure in result.figures:
        assert (tmp_path / figure).stat().st_size > 1000
    one_layer = result.data["one_layer_runs"]
    assert [run["beta"] for run in one_layer] == [0.0, 0.5, 1.0]
    for entry in one_layer:
        assert len(entry["losses"]) == 31
        assert all(math.isfinite(value) for value in entry["losses"])
    # beta X + Attn(X) at beta = 0 is Attn(X) itself.
    zero = one_layer[0]
    assert zero["residual_sigma_min"] == pytest.approx(zero["sigma_min"])
    depth = result.data["depth_runs"]
    assert {(run["depth"], run["beta"]) for run in depth} == {
        (1, 0.0),
        (1, 1.0),
        (2, 0.0),
        (2, 1.0),
    }
    assert all(len(run["losses"]) == 3 for run in depth)


def test_quick_run(tmp_path):
    """The one real-data study that runs at quick size in the default suite, so CI runs it."""
    result = run(Config.for_mode("quick"), tmp_path, progress=False)
    write_study(result, tmp_path)
    assert all(claim.reproduced is not None for claim in result.claims)
