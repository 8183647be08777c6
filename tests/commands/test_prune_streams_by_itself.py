"""``prune`` streams a Hugging Face folder by itself when loading it whole would not fit.

The memory available is a function the decision calls (:func:`available_memory`), replaced
here by a fake, so that a machine with plenty of memory plays one without it.
"""

from __future__ import annotations

import logging
import math

import pytest

import convergent.commands.prune_memory as prune_memory
from convergent.cli import main
from convergent.commands import prune_hf_folder
from convergent.commands.prune_memory import GIB, IN_MEMORY_FACTOR, chooses_streaming
from convergent.commands.prune_request import PruneRequest
from tests.commands.conftest import EXAMPLES, MAX_LENGTH

OPTIONS = {"data": "rt-sentences", "examples": EXAMPLES, "max_length": MAX_LENGTH,
           "calibration_examples": 8}  # fmt: skip
HIDDEN = 32  # conftest's GPT-2: n_embd


def _stored_elements(folder) -> int:
    """The folder's tensors' elements, as safetensors itself reads the file."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())  # noqa: SIM118


def _need(folder, element_bytes: int, calibration_examples: int, copies: int = 0) -> float:
    weights = _stored_elements(folder) * element_bytes
    states = 2 * calibration_examples * MAX_LENGTH * HIDDEN * element_bytes
    return weights * (IN_MEMORY_FACTOR + copies) + states


def test_the_estimate_counts_the_weights_in_the_dtype_loaded_and_the_calibration(gpt2_folder):
    import torch

    request = PruneRequest(sparsities=(0.5,), method="wanda", dtype=torch.bfloat16, **OPTIONS)
    estimate = prune_memory.memory_estimate(gpt2_folder, request, available=lambda: GIB)
    assert estimate.weights == _stored_elements(gpt2_folder) * 2
    assert estimate.need == pytest.approx(_need(gpt2_folder, 2, 8))
    # the folder's own float32, no calibration for magnitude, a copy for a second target
    several = PruneRequest(sparsities=(0.5, 0.7), **OPTIONS)
    estimate = prune_memory.memory_estimate(gpt2_folder, several, available=lambda: GIB)
    assert estimate.need == pytest.approx(_need(gpt2_folder, 4, 0, copies=1))


def test_it_streams_exactly_when_the_need_exceeds_what_is_available(gpt2_folder, tmp_path,
                                                                    caplog):  # fmt: skip
    request = PruneRequest(sparsities=(0.5,), method="wanda", save_to=tmp_path / "out", **OPTIONS)
    need = _need(gpt2_folder, 4, 8)
    with caplog.at_level(logging.WARNING, logger="convergent.commands.prune_memory"):
        assert not chooses_streaming(gpt2_folder, request, available=lambda: math.ceil(need))
        assert caplog.records == []
        assert chooses_streaming(gpt2_folder, request, available=lambda: math.floor(need) - 1)
    (record,) = caplog.records
    message = record.getMessage()
    assert f"about {need / GIB:.1f} GiB" in message and "GiB is available" in message
    assert "streamed" in message and "low_memory=False" in message
    # unknown memory: loaded whole, as before
    assert not chooses_streaming(gpt2_folder, request, available=lambda: None)


def test_low_memory_given_either_way_overrides_the_estimate(gpt2_folder, tmp_path):
    out = tmp_path / "out"
    for low_memory, expected in ((True, True), (False, False)):
        request = PruneRequest(sparsities=(0.5,), save_to=out, low_memory=low_memory, **OPTIONS)
        assert chooses_streaming(gpt2_folder, request, available=lambda: 0) is expected
        assert chooses_streaming(gpt2_folder, request, available=lambda: 2**60) is expected


@pytest.mark.parametrize(
    ("options", "why"),
    [({"sparsities": (0.5,)}, "save_to"), ({"sparsities": (0.5, 0.7)}, "one target per call")],
)
def test_a_request_that_cannot_stream_stays_in_memory_and_says_so(gpt2_folder, tmp_path,
                                                                  caplog, options, why):  # fmt: skip
    if why != "save_to":
        options = {**options, "save_to": tmp_path / "out"}
    request = PruneRequest(**options, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="convergent.commands.prune_memory"):
        assert not chooses_streaming(gpt2_folder, request, available=lambda: 0)
    (record,) = caplog.records
    assert "may not fit" in record.getMessage() and why in record.getMessage()


def test_a_sentence_encoder_is_never_streamed_by_itself(tmp_path, tokenizer, caplog):
    import torch
    from transformers import BertModel

    from tests.conftest import tiny_bert_config

    torch.manual_seed(0)
    folder = tmp_path / "encoder"
    BertModel(tiny_bert_config(vocab_size=len(tokenizer))).save_pretrained(folder)
    request = PruneRequest(sparsities=(0.5,), save_to=tmp_path / "out", **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="convergent.commands.prune_memory"):
        assert not chooses_streaming(folder, request, available=lambda: 0)
    assert "sentence encoder" in caplog.records[0].getMessage()


def test_the_library_call_streams_when_memory_is_short(gpt2_folder, tmp_path, monkeypatch):
    roomy = prune_hf_folder(gpt2_folder, (0.5,), save_to=tmp_path / "a", **OPTIONS)
    assert "low_memory" not in roomy
    monkeypatch.setattr(prune_memory, "available_memory", lambda: 1)
    short = prune_hf_folder(gpt2_folder, (0.5,), save_to=tmp_path / "b", **OPTIONS)
    assert short["low_memory"] is True
    assert short["rows"] == roomy["rows"] and short["dense"] == roomy["dense"]


def test_the_command_says_why_it_streams_in_flag_words(gpt2_folder, tmp_path, monkeypatch,
                                                       capsys, caplog):  # fmt: skip
    monkeypatch.setattr(prune_memory, "available_memory", lambda: 1)
    data = ["--data", "rt-sentences", "--examples", str(EXAMPLES), "--max-length",
            str(MAX_LENGTH), "--sparsity", "0.5", "--no-bench"]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="convergent.commands.prune_memory"):
        assert main(["prune", str(gpt2_folder), *data, "--save", str(tmp_path / "a")]) == 0
    (record,) = [record for record in caplog.records if record.name == prune_memory.__name__]
    assert "--low-memory does (--no-low-memory loads the model whole)" in record.getMessage()
    assert "low_memory" not in record.getMessage().replace("--low-memory", "")
    caplog.clear()
    out = tmp_path / "b"
    with caplog.at_level(logging.WARNING, logger="convergent.commands.prune_memory"):
        assert main(["prune", str(gpt2_folder), *data, "--save", str(out), "--no-low-memory"]) == 0
    assert [record for record in caplog.records if record.name == prune_memory.__name__] == []
    assert "(low memory)" not in (out / "pruning.md").read_text()
    capsys.readouterr()
