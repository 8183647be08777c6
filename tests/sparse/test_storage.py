"""Compressed weights files: state dicts bit for bit, shards, and damage found by checksum."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from convergent.sparse import MaskSpec, prune_one_shot
from convergent.sparse.storage import (
    COMPRESSED_INDEX,
    COMPRESSED_WEIGHTS,
    HEADER_KEY,
    CompressedFileError,
    encode_state_dict,
    group_dims,
    load_compressed_into,
    read_compressed,
    read_header,
    size_rows,
    write_compressed_file,
    write_compressed_index,
)
from tests.sparse.test_encoding import bits_of


class TiedModel(nn.Module):
    """An embedding tied to the output layer, a pruned layer and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 16)
        self.hidden = nn.Linear(16, 32)
        self.out = nn.Linear(32, 16)
        self.head = nn.Linear(16, 20, bias=False)
        self.head.weight = self.embedding.weight
        self.register_buffer("steps", torch.tensor([3, 4]))


def _pruned(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = TiedModel().to(dtype)
    prune_one_shot(model, 0.9, spec=MaskSpec(include_last=True))
    return model


def _assert_same_bits(left: dict, right: dict) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert torch.equal(bits_of(left[name]), bits_of(right[name])), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_state_dict_round_trips_through_a_file_bit_for_bit(tmp_path, dtype):
    model = _pruned(dtype)
    header = write_compressed_file(tmp_path / COMPRESSED_WEIGHTS, model.state_dict())
    assert header["tensors"]["head.weight"] == {"kind": "alias", "of": "embedding.weight"}
    assert header["tensors"]["hidden.weight"]["kind"] == "bitmask"
    assert header["tensors"]["hidden.bias"]["kind"] == "dense"
    _assert_same_bits(read_compressed(tmp_path), model.state_dict())
    assert read_header(tmp_path / COMPRESSED_WEIGHTS)["tensors"] == header["tensors"]


def test_loading_into_a_model_restores_it_tied_and_in_the_stored_dtype(tmp_path):
    model = _pruned(torch.bfloat16)
    write_compressed_file(tmp_path / COMPRESSED_WEIGHTS, model.state_dict())
    fresh = TiedModel()  # float32, other random weights
    load_compressed_into(fresh, tmp_path)
    _assert_same_bits(fresh.state_dict(), model.state_dict())
    assert (
        fresh.head.weight is fresh.embedding.weight and fresh.hidden.weight.dtype == torch.bfloat16
    )


def test_shards_and_their_index_load_as_one(tmp_path):
    state = _pruned().state_dict()
    names = list(state)
    shards = {
        "sparse_model-1.safetensors": {name: state[name] for name in names[:3]},
        "sparse_model-2.safetensors": {name: state[name] for name in names[3:]},
    }
    headers = {file: write_compressed_file(tmp_path / file, part) for file, part in shards.items()}
    write_compressed_index(tmp_path, headers)
    index = json.loads((tmp_path / COMPRESSED_INDEX).read_text())
    assert set(index["weight_map"]) == set(names)
    _assert_same_bits(read_compressed(tmp_path), state)


def test_a_conv1d_weight_groups_along_its_inputs():
    from transformers.pytorch_utils import Conv1D

    model = nn.Sequential(Conv1D(8, 16))  # weight [in 16, out 8]
    assert group_dims(model) == {"0.weight": 0}
    with torch.no_grad():
        model[0].weight.copy_(
            model[0].weight * (torch.arange(16) % 4 < 1)[:, None]
        )  # 1:4 on inputs
    _, header = encode_state_dict(model.state_dict(), group_dims(model))
    entry = header["tensors"]["0.weight"]
    assert (entry["kind"], entry["n"], entry["m"], entry["group_dim"]) == ("n:m", 1, 4, 0)
    rows = size_rows(header)
    assert [row["kind"] for row in rows] == ["1:4", "dense"]


def _flip_last_byte_of(path, tensor_name: str) -> None:
    """Flip one byte inside a stored tensor's data (not the header)."""
    raw = bytearray(path.read_bytes())
    header_size = int.from_bytes(raw[:8], "little")
    offsets = json.loads(raw[8 : 8 + header_size])[tensor_name]["data_offsets"]
    raw[8 + header_size + offsets[1] - 1] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_damaged_file_is_one_sentence_and_nothing_is_loaded(tmp_path):
    model = _pruned()
    path = tmp_path / COMPRESSED_WEIGHTS
    write_compressed_file(path, model.state_dict())
    _flip_last_byte_of(path, "out.weight#values")  # the last layer: earlier ones would load
    fresh = TiedModel()
    before = {name: value.clone() for name, value in fresh.state_dict().items()}
    with pytest.raises(CompressedFileError, match=r"the values of out\.weight does not match"):
        load_compressed_into(fresh, tmp_path)
    _assert_same_bits(fresh.state_dict(), before)
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    with pytest.raises(CompressedFileError, match="is damaged: not a readable safetensors file"):
        read_compressed(tmp_path)


def test_files_that_are_not_ours_or_do_not_fit_are_refused(tmp_path):
    save_file({"w": torch.zeros(2, 2)}, tmp_path / COMPRESSED_WEIGHTS)
    with pytest.raises(CompressedFileError, match=f"has no '{HEADER_KEY}' header"):
        read_compressed(tmp_path)
    with pytest.raises(CompressedFileError, match="holds no compressed weights"):
        read_compressed(tmp_path / "empty")
    write_compressed_file(tmp_path / "other" / COMPRESSED_WEIGHTS, nn.Linear(3, 2).state_dict())
    with pytest.raises(CompressedFileError, match=r"do not fit the model: missing \['embedding"):
        load_compressed_into(TiedModel(), tmp_path / "other")
