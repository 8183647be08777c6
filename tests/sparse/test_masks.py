"""Masks: selection rules, N:M, sparsity accounting, and state that survives checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from convergent.models import Transformer, TransformerConfig
from convergent.sparse import Masks, MaskSpec, magnitude_masks, n_m_mask
from convergent.train import load_checkpoint, save_checkpoint


def _vision_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = TransformerConfig(input_dim=16, num_outputs=10, d_model=32, n_heads=4, n_layers=2)
    return Transformer(config)


def test_selection_excludes_biases_norms_and_the_last_layer_by_default():
    assert "input_projection.weight" in MaskSpec().select(_vision_model()).names  # first: kept
    selection = MaskSpec(include_first=False).select(_vision_model())
    assert "input_projection.weight" in selection.excluded
    assert "head.weight" in selection.excluded
    assert "position_embedding.weight" in selection.excluded
    assert all("bias" not in name and "norm" not in name for name in selection.names)
    assert "blocks.0.attention.q_proj.weight" in selection.names
    assert len(selection.names) == 2 * 6  # q, k, v, o, up, down per block
    widened = MaskSpec(include_first=True, include_last=True, include_embeddings=True).select(
        _vision_model()
    )
    assert {"input_projection.weight", "head.weight", "position_embedding.weight"} <= set(
        widened.names
    )
    assert not widened.excluded
    by_name = MaskSpec(exclude=("attention",)).select(_vision_model())
    assert all("attention" not in name for name in by_name.names)


def test_sparsity_is_reported_over_prunable_parameters():
    model = _vision_model()
    selection = MaskSpec().select(model)
    masks = magnitude_masks(model, selection.names, 0.8, MaskSpec(distribution="global"))
    prunable = sum(dict(model.named_parameters())[n].numel() for n in selection.names)
    assert masks.numel == prunable
    assert prunable - masks.kept == round(0.8 * prunable)
    assert masks.sparsity() == pytest.approx(round(0.8 * prunable) / prunable)
    masks.apply(model)
    zeros = sum(int((dict(model.named_parameters())[n] == 0).sum()) for n in selection.names)
    assert zeros == round(0.8 * prunable)
    uniform = magnitude_masks(model, selection.names, 0.5, MaskSpec(distribution="uniform"))
    for value in uniform.per_parameter_sparsity().values():
        assert value == pytest.approx(0.5)


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (3, 8), (4, 4)])
@pytest.mark.parametrize("shape,input_dim", [((6, 8), 1), ((5, 11), 1), ((7, 3), 1), ((10, 6), 0)])
def test_n_m_keeps_the_largest_n_of_every_m_along_the_inputs(shape, input_dim, n, m):
    torch.manual_seed(0)
    weight = torch.randn(*shape)
    mask = n_m_mask(weight, n, m, input_dim=input_dim)
    rows = mask.movedim(input_dim, -1)
    magnitudes = weight.abs().movedim(input_dim, -1)
    length = rows.shape[-1]
    for start in range(0, length, m):
        group = rows[..., start : start + m]
        size = group.shape[-1]
        keep = n if size == m else -(-n * size // m)  # ceil(N * r / M) for a short group
        assert (group.sum(dim=-1) == keep).all()
        scores = magnitudes[..., start : start + m]
        smallest_kept = torch.where(group, scores, torch.inf).amin(dim=-1)
        largest_pruned = torch.where(group, -torch.inf, scores).amax(dim=-1)
        assert (smallest_kept >= largest_pruned).all()


def test_n_m_rejects_bad_shapes():
    with pytest.raises(ValueError, match="1 <= N <= M"):
        n_m_mask(torch.randn(4, 4), 5, 4)
    with pytest.raises(ValueError, match="pattern must be"):
        MaskSpec(pattern="2-4")


def test_masks_round_trip_a_checkpoint_into_a_fresh_model(tmp_path):
    model = _vision_model(seed=0)
    names = MaskSpec().select(model).names
    masks = magnitude_masks(model, names, 0.9)
    masks.apply(model)
    folder = save_checkpoint(tmp_path, 1, model, {"masks": masks.state_dict()})
    fresh = _vision_model(seed=1)
    state = load_checkpoint(folder, fresh)  # weights_only=True inside
    restored = Masks.from_state_dict(state["masks"])
    assert list(restored) == list(masks)
    for name, mask in masks.items():
        assert restored[name].dtype == torch.bool
        assert torch.equal(restored[name], mask)
    # A sparse checkpoint alone is enough to rebuild the masks.
    rebuilt = Masks.from_weights(fresh, names)
    for name, mask in masks.items():
        assert torch.equal(rebuilt[name], mask)
    assert rebuilt.sparsity() == pytest.approx(masks.sparsity())


def test_masks_reject_non_bool_and_mismatched_shapes():
    with pytest.raises(TypeError, match="bool"):
        Masks({"weight": torch.ones(2, 2)})
    with pytest.raises(ValueError, match="shape"):
        Masks({"weight": torch.ones(2, 2, dtype=torch.bool)}).apply(nn.Linear(3, 3))
    with pytest.raises(KeyError, match="no parameter"):
        Masks({"nope": torch.ones(2, 2, dtype=torch.bool)}).apply(nn.Linear(3, 3))


def test_load_state_dict_replaces_the_masks():
    masks = Masks({"weight": torch.ones(2, 2, dtype=torch.bool)})
    masks.load_state_dict({"weight": torch.eye(2, dtype=torch.bool)})
    assert torch.equal(masks["weight"], torch.eye(2, dtype=torch.bool))
    assert masks.sparsity() == 0.5
