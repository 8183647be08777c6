from __future__ import annotations

import json

import pytest
import torch

from convergent.studies import write_study
from convergent.studies.descent import Config, run
from convergent.studies.descent_parts import video_crops


def test_configs_for_every_mode():
    assert Config.for_mode("smoke").text_layers == 2
    assert len(Config.for_mode("full").seeds) > 1
    assert Config.for_mode("quick").mode == "quick"
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")


def test_video_crops_are_token_grids_of_the_frames():
    frames = torch.arange(2 * 8 * 8, dtype=torch.uint8).reshape(2, 8, 8)
    crops = video_crops(frames, 3, crop=4, patch=2, generator=torch.Generator().manual_seed(0))
    assert crops.shape == (3, 4, 4)
    # the first token of a crop is its top-left 2x2 block, row by row
    first = crops[0, 0] * 255
    assert first[1] - first[0] == 1 and first[2] - first[0] == 8
    with pytest.raises(ValueError, match="multiple of the patch size"):
        video_crops(frames, 1, crop=5, patch=2, generator=torch.Generator())


def test_smoke_run_writes_a_report_with_every_table_claim_and_figure(tmp_path):
    config = Config.for_mode("smoke")
    result = run(config, tmp_path, progress=False)
    report = write_study(result, tmp_path)
    assert report.is_file()
    for figure in result.figures:
        assert (tmp_path / figure).stat().st_size > 0
    assert len(result.claims) == 7 and all(c.reproduced is None for c in result.claims)
    payload = json.loads((tmp_path / "results.json").read_text())
    text = payload["data"]["text"]["runs"]
    for method in ("erm", "constrained"):
        record = text[method][0]
        assert len(record["layer_losses"]) == 3  # MiniLM cut to 2 layers: f_0 .. f_2
        assert set(record) >= {"clean", "gaussian", "uniform", "discrete", "fraction_satisfied"}
    assert len(text["constrained"][0]["multipliers"]) == 2
    video = payload["data"]["video"]["runs"]
    assert len(video["erm"][0]["rmse"]) == len(config.noise_multiples)
