"""Block-by-block Wanda and SparseGPT (``prune_one_shot``) against a reference written here.

The reference never caches hidden states: before pruning each block it runs the whole model
over the calibration batches, with hooks that record the raw inputs of the block's layers,
and prunes them from those inputs. So block k is calibrated on what the pruned blocks before
it produce, which is what the driver's cached, block-at-a-time passes must reproduce.
"""

from __future__ import annotations

import copy
import weakref

import pytest
import torch
from torch import Tensor, nn

from convergent.models import Transformer, TransformerConfig
from convergent.sparse import MaskSpec, prune_one_shot
from convergent.sparse.calibration import find_blocks
from convergent.sparse.sparsegpt import sparsegpt_prune

VOCAB = 64
SPARSEGPT_OPTIONS = {"block_size": 16, "damping": 0.01}


def ours(seed: int = 0) -> Transformer:
    """A causal char LM with dropout (so a calibration in train mode would show)."""
    torch.manual_seed(seed)
    config = TransformerConfig(task="lm", vocab_size=VOCAB, max_len=16, d_model=32, n_heads=2,
                               n_layers=2, causal=True, dropout=0.1)  # fmt: skip
    return Transformer(config)


def gpt2(seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def regression(seed: int = 0) -> Transformer:
    """Continuous inputs: a linear input projection runs before the blocks."""
    torch.manual_seed(seed)
    config = TransformerConfig(task="regression", input_dim=8, num_outputs=3, pooling="token",
                               max_len=16, d_model=32, n_heads=2, n_layers=2)  # fmt: skip
    return Transformer(config)


MODELS = {"ours": (ours, "blocks"), "gpt2": (gpt2, "transformer.h")}


def calibration(seed: int = 0, sizes=((2, 12), (3, 12), (2, 9))) -> list[dict[str, Tensor]]:
    """Token batches of different shapes, the first row of each right-padded."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for rows, length in sizes:
        ids = torch.randint(0, VOCAB, (rows, length), generator=generator)
        attention_mask = torch.ones(rows, length, dtype=torch.long)
        attention_mask[0, -3:] = 0
        batches.append({"input_ids": ids, "attention_mask": attention_mask, "labels": ids})
    return batches


def feature_calibration(seed: int = 0) -> list[dict[str, Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [{"inputs": torch.randn(3, 10, 8, generator=generator)} for _ in range(2)]


# ---- the reference ---------------------------------------------------------------------------


def _owner(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rsplit(".", 1)[0])


def _stored_transposed(module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, Conv1D)


def _as_rows(module: nn.Module, tensor: Tensor) -> Tensor:
    """[out, in]: GPT-2's Conv1D stores its weight [in, out]."""
    return tensor.T if _stored_transposed(module) else tensor


def _recorded_inputs(model: nn.Module, names: list[str], batches) -> dict[str, Tensor]:
    """Each layer's inputs over full forward passes, [tokens, in] in float64."""
    seen: dict[str, list[Tensor]] = {name: [] for name in names}

    def record(name: str):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            x = args[0].detach()
            seen[name].append(x.reshape(-1, x.shape[-1]).double())

        return hook

    handles = [_owner(model, n).register_forward_hook(record(n)) for n in names]
    try:
        with torch.no_grad():
            for batch in batches:
                model(**{key: value for key, value in batch.items() if key != "labels"})
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat(parts) for name, parts in seen.items()}


def _keep_top(scores: Tensor, sparsity: float, pattern: str) -> Tensor:
    """Per row, the top in - int(in * s) scores (the Wanda authors' count), or the top N of
    every M inputs."""
    out, inputs = scores.shape
    if pattern == "unstructured":
        n, m = inputs - int(inputs * sparsity), inputs
    else:
        n, m = (int(part) for part in pattern.split(":"))
    groups = scores.reshape(out, inputs // m, m)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    return keep.scatter_(-1, groups.topk(n, dim=-1).indices, True).reshape(out, inputs)


def _magnitude_keep(weight: Tensor, sparsity: float) -> Tensor:
    magnitudes = weight.detach().abs().reshape(-1)
    keep = torch.zeros_like(magnitudes, dtype=torch.bool)
    kept = magnitudes.numel() - round(sparsity * magnitudes.numel())
    return keep.scatter_(0, magnitudes.topk(kept).indices, True).reshape(weight.shape)


def reference_prune(model, stages, batches, sparsity, pattern, method, magnitude=()):
    """Prune ``stages`` (lists of names) in order, each from fresh whole-model passes.

    ``magnitude`` names (embeddings) are pruned first, by per-tensor magnitude.
    """
    model.eval()
    masks: dict[str, Tensor] = {}
    with torch.no_grad():
        for name in magnitude:
            weight = model.get_parameter(name)
            masks[name] = _magnitude_keep(weight, sparsity)
            weight.mul_(masks[name])
        for names in stages:
            inputs = _recorded_inputs(model, names, batches)
            for name in names:
                module = _owner(model, name)
                rows, x = _as_rows(module, module.weight.detach()), inputs[name]
                if method == "wanda":
                    keep = _keep_top(rows.double().abs() * x.square().sum(0).sqrt(), sparsity,
                                     pattern)  # fmt: skip
                    new = torch.where(keep, rows, torch.zeros_like(rows))
                else:
                    new, keep = sparsegpt_prune(rows, x.T @ x, sparsity, pattern,
                                                **SPARSEGPT_OPTIONS)  # fmt: skip
                module.weight.copy_(_as_rows(module, new))
                masks[name] = _as_rows(module, keep)
    return masks


def block_stages(names: list[str], prefix: str, blocks: int) -> list[list[str]]:
    return [[n for n in names if n.startswith(f"{prefix}.{index}.")] for index in range(blocks)]


def assert_same_pruning(report, model, masks, reference, exact: bool) -> None:
    assert list(report.masks) == list(masks)
    for name, mask in masks.items():
        assert torch.equal(report.masks[name], mask), name
    expected = reference.state_dict()
    for name, value in model.state_dict().items():
        if exact:
            assert torch.equal(value, expected[name]), name
        else:
            torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-8, msg=name)


def _prune_both(build, prefix, spec, sparsity, method, batches):
    model = build()
    reference = copy.deepcopy(model)
    options = SPARSEGPT_OPTIONS if method == "sparsegpt" else None
    report = prune_one_shot(model, sparsity, spec=spec, method=method, calibration=batches,
                            options=options)  # fmt: skip
    names = spec.select(reference).names
    stages = block_stages(names, prefix, 2)
    assert [name for stage in stages for name in stage] == names  # all inside the blocks
    masks = reference_prune(reference, stages, batches, sparsity, spec.pattern, method)
    return report, model, masks, reference


# ---- parity with the reference ---------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["unstructured", "2:4"])
@pytest.mark.parametrize("which", ["ours", "gpt2"])
def test_wanda_equals_the_whole_model_reference_block_by_block(which, pattern):
    build, prefix = MODELS[which]
    spec = MaskSpec(include_first=True, pattern=pattern)
    pruned = _prune_both(build, prefix, spec, 0.6, "wanda", calibration())
    assert_same_pruning(*pruned, exact=True)


@pytest.mark.parametrize("pattern", ["unstructured", "2:4"])
@pytest.mark.parametrize("which", ["ours", "gpt2"])
def test_sparsegpt_equals_the_whole_model_reference_block_by_block(which, pattern):
    build, prefix = MODELS[which]
    spec = MaskSpec(include_first=True, pattern=pattern)
    pruned = _prune_both(build, prefix, spec, 0.5, "sparsegpt", calibration())
    assert_same_pruning(*pruned, exact=False)


def test_the_blocks_are_the_module_list_holding_the_most_prunable_layers():
    model = ours()
    found = find_blocks(model, MaskSpec(include_last=True).select(model).names)
    assert found is not None and found[0] == "blocks" and found[1] is model.blocks
    model = gpt2()
    found = find_blocks(model, MaskSpec().select(model).names)
    assert found is not None and found[0] == "transformer.h" and found[1] is model.transformer.h
    assert find_blocks(nn.Sequential(nn.Linear(2, 2)), ["0.weight"]) is None


@pytest.mark.parametrize("pattern", ["2:4", "4:8"])
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("which", ["ours", "gpt2"])
def test_every_n_m_group_of_inputs_keeps_at_most_n_weights(which, method, pattern):
    build, _ = MODELS[which]
    model = build()
    n, m = (int(part) for part in pattern.split(":"))
    options = SPARSEGPT_OPTIONS if method == "sparsegpt" else None
    report = prune_one_shot(model, 0.5, spec=MaskSpec(include_first=True, pattern=pattern),
                            method=method, calibration=calibration(), options=options)  # fmt: skip
    assert len(report.masks) == (12 if which == "ours" else 8)
    for name, mask in report.masks.items():
        module = _owner(model, name)
        dim = 0 if _stored_transposed(module) else 1
        assert dim == (0 if which == "gpt2" else 1)
        nonzero = _as_rows(module, module.weight != 0)  # [out, in]
        kept = _as_rows(module, mask)
        groups = nonzero.reshape(nonzero.shape[0], -1, m).sum(dim=-1)
        assert int(groups.max()) <= n, name
        assert (kept.reshape(kept.shape[0], -1, m).sum(dim=-1) == n).all(), name
        assert not bool((module.weight[~mask] != 0).any()), name


# ---- layers outside the blocks ---------------------------------------------------------------


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_an_lm_head_after_the_blocks_is_calibrated_on_the_pruned_blocks(method):
    model = ours()
    reference = copy.deepcopy(model)
    spec = MaskSpec(include_first=False, include_last=True)
    options = SPARSEGPT_OPTIONS if method == "sparsegpt" else None
    report = prune_one_shot(model, 0.5, spec=spec, method=method, calibration=calibration(),
                            options=options)  # fmt: skip
    names = spec.select(reference).names
    assert names[-1] == "head.weight" and "blocks.0.attention.q_proj.weight" not in names
    stages = [*block_stages(names, "blocks", 2), ["head.weight"]]
    masks = reference_prune(reference, stages, calibration(), 0.5, "unstructured", method)
    assert_same_pruning(report, model, masks, reference, exact=method == "wanda")
    stages = {layer["name"]: layer["stage"] for layer in report.layers}
    assert stages["head.weight"] == "after"
    assert stages["blocks.1.feed_forward.up_proj.weight"] == "1"
    # the first layer stays dense although its neighbours, reading the same input, are pruned
    assert not bool((model.blocks[0].attention.q_proj.weight == 0).any())


@pytest.mark.parametrize("include_last", [False, True])
def test_the_last_block_runs_again_only_for_a_layer_calibrated_after_it(include_last):
    # Each block runs once to gather its statistics and once more, pruned, to give the next
    # block its inputs; after the last one, only a calibrated layer beyond the blocks (the LM
    # head here) reads those outputs, so without one the last block runs once per batch.
    model = ours()
    runs = [0] * len(model.blocks)
    for index, block in enumerate(model.blocks):
        block.register_forward_hook(
            lambda *_, index=index: runs.__setitem__(index, runs[index] + 1)
        )
    batches = calibration()
    spec = MaskSpec(include_last=include_last)
    prune_one_shot(model, 0.5, spec=spec, method="wanda", calibration=batches)
    if include_last:  # as often as the first block (the head's pass replays them both)
        assert runs[1] == runs[0] >= 2 * len(batches)
    else:
        assert runs == [2 * len(batches), len(batches)]


def test_an_input_projection_before_the_blocks_is_calibrated_on_the_raw_inputs():
    model = regression()
    reference = copy.deepcopy(model)
    spec = MaskSpec(include_first=True)
    report = prune_one_shot(model, 0.5, spec=spec, method="wanda",
                            calibration=feature_calibration())  # fmt: skip
    names = spec.select(reference).names
    assert names[0] == "input_projection.weight"
    stages = [["input_projection.weight"], *block_stages(names, "blocks", 2)]
    masks = reference_prune(reference, stages, feature_calibration(), 0.5, "unstructured", "wanda")
    assert_same_pruning(report, model, masks, reference, exact=True)
    assert report.layers[0]["stage"] == "before"


def test_embeddings_fall_back_to_magnitude_and_are_pruned_before_calibrating():
    model = ours()
    reference = copy.deepcopy(model)
    spec = MaskSpec(include_embeddings=True, include_first=True)
    report = prune_one_shot(model, 0.5, spec=spec, method="wanda", calibration=calibration())
    embeddings = ["token_embedding.weight", "position_embedding.weight"]
    names = spec.select(reference).names
    assert set(embeddings) <= set(names)
    blocks = [name for name in names if name not in embeddings]
    masks = reference_prune(reference, block_stages(blocks, "blocks", 2), calibration(), 0.5,
                            "unstructured", "wanda", magnitude=embeddings)  # fmt: skip
    masks = {name: masks[name] for name in names}  # the selection's order
    assert_same_pruning(report, model, masks, reference, exact=True)
    methods = {layer["name"]: layer["method"] for layer in report.layers}
    assert [methods.pop(name) for name in embeddings] == ["magnitude", "magnitude"]
    assert set(methods.values()) == {"wanda"}


# ---- errors ----------------------------------------------------------------------------------


GLOBAL = MaskSpec(distribution="global")
ERRORS = {
    "unknown method": ({"method": "foo", "calibration": calibration()}, "'foo'"),
    "no calibration": ({"method": "wanda"}, "needs calibration batches"),
    "global": ({"method": "wanda", "calibration": calibration(), "spec": GLOBAL}, "'global'"),
    "options": (
        {"method": "wanda", "calibration": calibration(), "options": {"damping": 0.1}},
        r"wanda takes the options \['rounding', 'statistics'\], not \['damping'\]",
    ),
    "empty sparsegpt": ({"method": "sparsegpt", "calibration": []}, "no calibration batches"),
    "empty wanda": ({"method": "wanda", "calibration": []}, "no calibration batches"),
}


@pytest.mark.parametrize("arguments, message", list(ERRORS.values()), ids=list(ERRORS))
def test_user_errors_are_one_sentence_and_leave_the_model_untouched(arguments, message):
    model = ours()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=message) as error:
        prune_one_shot(model, 0.5, **arguments)
    assert "\n" not in str(error.value)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


# ---- the report ------------------------------------------------------------------------------


def _pruned(method: str, rows: int, columns: int, sparsity: float) -> int:
    """Wanda prunes int(in * s) per row; SparseGPT, in each block of B columns, the entries at
    or below the int(rows * B * s)-th lowest score (counted from 0), so one more (no ties)."""
    if method == "wanda":
        return rows * int(columns * sparsity)
    size = SPARSEGPT_OPTIONS["block_size"]
    widths = [min(size, columns - start) for start in range(0, columns, size)]
    return sum(int(rows * width * sparsity) + 1 for width in widths)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_the_report_counts_the_zeros_and_the_model_keeps_its_mode(method, training):
    model = ours()
    model.train(training)
    inputs = {key: value for key, value in calibration()[0].items() if key != "labels"}
    with torch.no_grad():
        dense = model.eval()(**inputs).logits
    model.train(training)
    options = SPARSEGPT_OPTIONS if method == "sparsegpt" else None
    report = prune_one_shot(model, 0.6, spec=MaskSpec(include_first=True, include_last=True),
                            method=method, calibration=calibration(), options=options)  # fmt: skip
    assert model.training is training
    assert all(module.training is training for module in model.modules())
    names = [layer["name"] for layer in report.layers]
    assert names == list(report.masks) and len(names) == len(set(names)) == 13
    parameters = dict(model.named_parameters())
    pruned = 0
    for layer in report.layers:
        weight = parameters[layer["name"]]
        zeros = int((weight == 0).sum())
        pruned += zeros
        assert layer["sparsity"] == pytest.approx(zeros / weight.numel()), layer["name"]
        assert layer["shape"] == list(weight.shape) and layer["method"] == method
        assert (
            zeros
            == int((~report.masks[layer["name"]]).sum())
            == _pruned(method, *weight.shape, 0.6)  # nn.Linear: [out, in]
        ), layer["name"]
    assert report.pruned == pruned and report.method == method
    assert report.sparsity == pytest.approx(pruned / report.prunable)
    with torch.no_grad():
        sparse = model.eval()(**inputs).logits
    assert not torch.allclose(dense, sparse)


def test_each_hessian_is_dropped_once_the_layers_reading_it_are_pruned(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    import convergent.sparse.sparsegpt as sparsegpt_module

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=16)  # fmt: skip
    seen: list[weakref.ref] = []
    others_alive: list[int] = []

    def recording(weight, hessian, *args, **kwargs):
        others_alive.append(sum(ref() is not None and ref() is not hessian for ref in seen))
        seen.append(weakref.ref(hessian))
        return sparsegpt_prune(weight, hessian, *args, **kwargs)

    monkeypatch.setattr(sparsegpt_module, "sparsegpt_prune", recording)
    prune_one_shot(LlamaForCausalLM(config), 0.5, spec=MaskSpec(), method="sparsegpt",
                   calibration=calibration(), options=SPARSEGPT_OPTIONS)  # fmt: skip
    # q, k, v, o, gate, up, down in each of 2 blocks; q, k and v share one Hessian, as do gate
    # and up, so when a layer is pruned no Hessian of a layer already pruned is still held
    assert len(seen) == 14
    assert others_alive == [0] * 14
