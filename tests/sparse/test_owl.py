"""OWL: outlier ratios, the allocation worked out by hand, and OWL inside the one-shot pruners."""

from __future__ import annotations

import copy

import pytest
import torch

from convergent.sparse import MaskSpec, outlier_ratio, owl_sparsities, prune_one_shot
from tests.sparse.test_blockwise import calibration, ours


def test_outlier_ratio_counts_the_scores_above_m_times_the_block_mean():
    # Pooled over the block: mean 2.0 (sum 20 over 10 entries), so M = 2 puts the bar at 4.0.
    scores = [torch.tensor([[1.0, 1.0, 1.0, 5.0]]), torch.tensor([1.0, 1.0, 1.0, 1.0, 4.0, 4.0])]
    assert outlier_ratio(scores, 2.0) == pytest.approx(1 / 10)  # only 5.0 is above 4.0
    assert outlier_ratio(scores, 1.5) == pytest.approx(3 / 10)  # 5, 4, 4 above 3.0


def test_the_allocation_matches_one_worked_out_by_hand():
    # Ratios 0.01, 0.03, 0.02, 0.05 -> min-max scaled 0, 0.5, 0.25, 1; lambda 0.1 -> kept shares
    # 0, 0.1, 0.05, 0.2 plus c; their mean must be 1 - 0.6 = 0.4, so c = 0.4 - 0.0875 = 0.3125.
    ratios, sizes = [0.01, 0.03, 0.02, 0.05], [100] * 4
    expected = [1 - 0.3125, 1 - 0.4125, 1 - 0.3625, 1 - 0.5125]
    got = owl_sparsities(ratios, sizes, 0.6, 0.1)
    assert got == pytest.approx(expected)
    assert sum(got) / 4 == pytest.approx(0.6)
    assert max(got) - min(got) == pytest.approx(2 * 0.1)
    # More outliers, less pruned: the order of the sparsities reverses that of the ratios.
    assert sorted(range(4), key=lambda i: got[i]) == sorted(range(4), key=lambda i: -ratios[i])


def test_the_mean_is_weighted_by_each_blocks_prunable_weights():
    got = owl_sparsities([0.0, 1.0], [300, 100], 0.5, 0.05)
    # kept shares 0 + c and 0.1 + c with (300 c + 100 (0.1 + c)) / 400 = 0.5 -> c = 0.475
    assert got == pytest.approx([0.525, 0.425])
    assert (300 * got[0] + 100 * got[1]) / 400 == pytest.approx(0.5)


def test_equal_ratios_keep_the_target_and_a_span_past_the_bounds_is_one_sentence():
    assert owl_sparsities([0.02, 0.02], [10, 10], 0.7, 0.08) == pytest.approx([0.7, 0.7])
    with pytest.raises(ValueError, match=r"would give a block the sparsity 1\.0300, outside"):
        owl_sparsities([0.0, 1.0], [10, 10], 0.95, 0.08)


@pytest.mark.parametrize("method", ["magnitude", "wanda", "sparsegpt"])
def test_owl_prunes_each_block_to_its_own_sparsity_around_the_target(method):
    model = ours()
    options = {"block_size": 16} if method == "sparsegpt" else None
    spec = MaskSpec(distribution="owl", owl_lmbda=0.1, owl_m=2.0)
    report = prune_one_shot(model, 0.6, spec=spec, method=method, calibration=calibration(),
                            options=options)  # fmt: skip
    blocks = report.block_sparsities
    assert sorted(blocks) == [0, 1]
    assert max(blocks.values()) - min(blocks.values()) == pytest.approx(0.2)
    assert sum(blocks.values()) / 2 == pytest.approx(0.6)  # the blocks are alike
    for layer in report.layers:
        block = int(layer["name"].split(".")[1])
        assert layer["target"] == blocks[block]
        # within one weight per row of the block's target
        rows = layer["shape"][0]
        assert abs(layer["sparsity"] - blocks[block]) <= 1 / layer["shape"][1] + 1 / (
            rows * layer["shape"][1]
        )


def test_owl_ratios_come_from_the_dense_model_whatever_the_pruner():
    """Magnitude and SparseGPT get the same allocation: it is read before anything is pruned."""
    spec = MaskSpec(distribution="owl", owl_m=2.0)
    allocations = []
    for method in ("magnitude", "sparsegpt"):
        report = prune_one_shot(ours(), 0.5, spec=spec, method=method, calibration=calibration())
        allocations.append(report.block_sparsities)
    assert allocations[0] == allocations[1]


def test_owl_refuses_n_m_training_masks_and_a_missing_calibration_in_one_sentence():
    with pytest.raises(ValueError, match=r"cannot be combined with the N:M pattern '2:4'"):
        MaskSpec(distribution="owl", pattern="2:4")
    model = ours()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"distribution 'owl' needs calibration batches"):
        prune_one_shot(model, 0.5, spec=MaskSpec(distribution="owl"))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])
    from convergent.sparse import magnitude_masks

    with pytest.raises(ValueError, match=r"applies to one-shot pruning \(prune_one_shot\) only"):
        magnitude_masks(model, ["blocks.0.attention.q_proj.weight"], 0.5,
                        MaskSpec(distribution="owl"))  # fmt: skip


def test_outlier_ratio_pools_layers_of_different_sizes_and_means():
    # Layer a: 8 scores, mean 2; layer b: 2 scores, mean 10. Pooled: 36 / 10 = 3.6, so M = 2
    # puts the bar at 7.2 and 9, 10, 10 are above it: 3 of 10. Per-layer bars (4 and 20)
    # would count 1 of 10, a bar at the mean of the layers' means (12) none.
    scores = [torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0]]), torch.tensor([10.0, 10.0])]
    assert outlier_ratio(scores, 2.0) == pytest.approx(3 / 10)


def _deep_ours(seed: int = 0):
    from convergent.models import Transformer, TransformerConfig
    from tests.sparse.test_blockwise import VOCAB

    torch.manual_seed(seed)
    config = TransformerConfig(task="lm", vocab_size=VOCAB, max_len=16, d_model=32, n_heads=2,
                               n_layers=4, causal=True, dropout=0.1)  # fmt: skip
    return Transformer(config)


def _deep_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.sparse.test_blockwise import VOCAB

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=3, n_head=2,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def _expected_owl(model, prefix: str, blocks: int, target: float, m: float, lmbda: float):
    """OWL's allocation written out here: each block's inputs recorded by full dense forward
    passes, Wanda's scores pooled per block, the ratios min-max scaled, the mean shifted."""
    from tests.sparse.test_blockwise import _as_rows, _owner, _recorded_inputs

    names = MaskSpec().select(model).names
    inputs = _recorded_inputs(model.eval(), names, calibration())
    ratios, sizes = [], []
    for index in range(blocks):
        block = [n for n in names if n.startswith(f"{prefix}.{index}.")]
        scores = []
        for name in block:
            rows = _as_rows(_owner(model, name), model.get_parameter(name).detach()).double()
            scores.append((rows.abs() * inputs[name].square().sum(0).sqrt()).reshape(-1))
        pooled = torch.cat(scores)
        ratios.append(float((pooled > m * pooled.mean()).double().mean()))
        sizes.append(pooled.numel())
    low, high = min(ratios), max(ratios)
    kept = [2 * lmbda * (r - low) / (high - low) for r in ratios]
    shift = (1 - target) - sum(k * n for k, n in zip(kept, sizes, strict=True)) / sum(sizes)
    return ratios, [1 - (k + shift) for k in kept]


@pytest.mark.parametrize(("build", "prefix", "blocks"), [(_deep_ours, "blocks", 4),
                                                         (_deep_gpt2, "transformer.h", 3)])  # fmt: skip
def test_owl_gives_each_block_of_a_deep_model_the_sparsity_of_its_dense_inputs(
    build, prefix, blocks
):
    model = build()
    ratios, expected = _expected_owl(copy.deepcopy(model), prefix, blocks, 0.6, 2.0, 0.08)
    assert len(set(ratios)) == blocks  # distinct ratios: which block gets which is visible
    spec = MaskSpec(distribution="owl", owl_m=2.0, owl_lmbda=0.08)
    report = prune_one_shot(model, 0.6, spec=spec, method="wanda", calibration=calibration())
    assert sorted(report.block_sparsities) == list(range(blocks))
    got = [report.block_sparsities[index] for index in range(blocks)]
    assert got == pytest.approx(expected, abs=1e-12)
