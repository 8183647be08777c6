"""One contract for every pruner in ``PRUNERS``: a new pruner is one module, one entry there,
and nothing here to change.

Each pruner, block by block on our Transformer and on GPT-2 (``Conv1D``): every prunable matrix
reaches its target within one weight per row, N:M holds along each layer's inputs, the masks are
the weights' zeros, the report counts them, OWL gives each block its own sparsity, and under
``torchrun`` two ranks calibrating on different batches end with the masks and weights one
process gets from all the batches.
"""

from __future__ import annotations

import pytest
import torch

from convergent.sparse import PRUNERS, MaskSpec, Pruner, make_pruner, prune_one_shot
from tests.sparse.test_blockwise import MODELS, SPARSEGPT_OPTIONS, calibration


def _options(method: str) -> dict | None:
    return SPARSEGPT_OPTIONS if method == "sparsegpt" else None


def _rows(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> torch.Tensor:
    owner = model.get_submodule(name.rsplit(".", 1)[0])
    return tensor.T if type(owner).__name__ == "Conv1D" else tensor


def test_every_pruner_is_found_by_its_name_and_takes_its_fields_as_options():
    for name, cls in PRUNERS.items():
        pruner: Pruner = make_pruner(name)
        assert type(pruner) is cls and pruner.name == name
        assert isinstance(pruner.calibrated, bool)
    with pytest.raises(ValueError, match=r"method must be one of \('magnitude', 'wanda', "):
        make_pruner("obs")
    with pytest.raises(ValueError, match=r"magnitude takes no options, not \['damping'\]"):
        make_pruner("magnitude", {"damping": 0.1})


@pytest.mark.parametrize("pattern", ["unstructured", "2:4"])
@pytest.mark.parametrize("which", list(MODELS))
@pytest.mark.parametrize("method", list(PRUNERS))
def test_the_target_is_reached_and_the_pattern_held(method, which, pattern):
    model = MODELS[which][0]()
    spec = MaskSpec(pattern=pattern)
    target = 0.5 if pattern == "2:4" else 0.7
    report = prune_one_shot(model, target, spec=spec, method=method, calibration=calibration(),
                            options=_options(method))  # fmt: skip
    parameters = dict(model.named_parameters())
    assert list(report.masks) == spec.select(model).names
    pruned = 0
    for name, mask in report.masks.items():
        weight = parameters[name].detach()
        assert torch.equal(mask, weight != 0), name
        rows = _rows(model, name, weight)
        zeros = int((rows == 0).sum())
        pruned += zeros
        assert abs(zeros - target * rows.numel()) <= rows.shape[0] + 1, name
        if pattern == "2:4":
            groups = (rows != 0).reshape(rows.shape[0], -1, 4).sum(dim=-1)
            assert int(groups.max()) <= 2, name
    assert report.pruned == pruned


@pytest.mark.parametrize("method", list(PRUNERS))
def test_owl_gives_each_block_its_own_sparsity_for_every_pruner(method):
    model = MODELS["ours"][0]()
    spec = MaskSpec(distribution="owl", owl_m=2.0)
    report = prune_one_shot(model, 0.6, spec=spec, method=method, calibration=calibration(),
                            options=_options(method))  # fmt: skip
    values = list(report.block_sparsities.values())
    assert len(values) == 2 and max(values) - min(values) == pytest.approx(2 * spec.owl_lmbda)
    for layer in report.layers:
        assert layer["target"] == report.block_sparsities[int(layer["name"].split(".")[1])]


@pytest.mark.distributed
def test_two_ranks_with_different_batches_prune_like_one_process_on_all_of_them(tmp_path):
    from tests.launch import torchrun
    from tests.sparse.blockwise_ddp_worker import CASES, run_case

    assert {case.split("/")[1] for case in CASES} == set(PRUNERS)
    output = tmp_path / "result"
    torchrun("tests.sparse.blockwise_ddp_worker", str(output), processes=2)
    ranks = [torch.load(f"{output}.rank{rank}", weights_only=True) for rank in (0, 1)]
    for case in CASES:
        masks, state = run_case(case, calibration())  # one process, every batch
        method = case.split("/")[1]
        first, second = ranks[0][case], ranks[1][case]
        assert list(first["masks"]) == list(second["masks"]) == list(masks)
        for name, mask in masks.items():
            assert torch.equal(first["masks"][name], second["masks"][name]), (case, name)
            assert torch.equal(first["masks"][name], mask), (case, name)
        for name, value in state.items():
            assert torch.equal(first["state"][name], second["state"][name]), (case, name)
            if method != "sparsegpt":
                assert torch.equal(first["state"][name], value), (case, name)
            else:
                torch.testing.assert_close(first["state"][name], value, rtol=1e-6, atol=1e-8)
