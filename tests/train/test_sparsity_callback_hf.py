"""SparsityCallback: AC/DC sparse training inside a plain transformers.Trainer."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from convergent.optim import HORST
from convergent.sparse import MaskSpec
from tests.conftest import TensorDataset, tiny_bert_config
from tests.launch import torchrun

transformers = pytest.importorskip("transformers")
from convergent.train.sparse_hf import STATE_FILE, SparsityCallback  # noqa: E402


def tiny_bert() -> nn.Module:
    config = tiny_bert_config(vocab_size=100, num_labels=2, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def token_data(examples: int = 32, lm: bool = False) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (examples, 8), generator=generator)
    labels = ids.clone() if lm else torch.randint(0, 2, (examples,), generator=generator)
    return TensorDataset(
        input_ids=ids, attention_mask=torch.ones(examples, 8, dtype=torch.long), labels=labels
    )


# The masks these tests count: one global threshold, the first and the last layer dense.
SPEC = MaskSpec(distribution="global", include_first=False)


def expected_prunable(model: nn.Module) -> dict[str, torch.Tensor]:
    """Written here, not taken from select_prunable: every Linear / GPT-2 Conv1D weight
    except the first and the last such layer in module order, each tensor once."""
    layers = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"
    ]
    kept, seen = {}, set()
    for name, module in layers[1:-1]:
        if id(module.weight) not in seen:
            seen.add(id(module.weight))
            kept[f"{name}.weight"] = module.weight
    return kept


class Recorder(transformers.TrainerCallback):
    """After SparsityCallback in the list: sees each step's weights once they are re-masked."""

    def __init__(self, sparsity_callback: SparsityCallback) -> None:
        self.sparsity_callback = sparsity_callback
        self.zero_shares: list[float] = []
        self.pruned_first_moments: list[float] = []

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **_):
        weights = expected_prunable(model)
        total = sum(w.numel() for w in weights.values())
        self.zero_shares.append(sum(int((w == 0).sum()) for w in weights.values()) / total)
        masks = self.sparsity_callback.masked.masks
        moment = 0.0
        if masks is not None:
            for name, weight in weights.items():
                exp_avg = optimizer.state[weight]["exp_avg"]
                moment += float(exp_avg[masks[name] == 0].abs().sum())
        self.pruned_first_moments.append(moment)


def _train(output_dir, model, data, callback, *, steps, optimizer=None, resume=None, **options):
    settings = {"per_device_train_batch_size": 4, "learning_rate": 1e-3, "max_steps": steps,
                "logging_steps": 1, "report_to": [], "use_cpu": True, "save_strategy": "steps",
                "save_steps": 4, "disable_tqdm": True}  # fmt: skip
    args = transformers.TrainingArguments(output_dir=str(output_dir), **{**settings, **options})
    recorder = Recorder(callback)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, callbacks=[callback, recorder],
        optimizers=(optimizer, None) if optimizer is not None else (None, None),
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    return trainer, recorder


def test_fixed_masks_hold_the_target_after_every_step_with_horst(tmp_path):
    model = tiny_bert()
    weights = expected_prunable(model)
    flat = torch.cat([w.detach().abs().flatten() for w in weights.values()])
    keep = flat.numel() - round(0.8 * flat.numel())
    threshold = flat.topk(keep).values.min()  # global magnitude, from the initial weights
    first_kept = {name: w.detach().abs() >= threshold for name, w in weights.items()}
    callback = SparsityCallback(sparsity=0.8, schedule="fixed", spec=SPEC)
    optimizer = HORST(model.parameters(), lr=1e-3, alpha=10.0)
    trainer, recorder = _train(tmp_path, model, token_data(), callback, steps=6,
                               optimizer=optimizer)  # fmt: skip
    assert sorted(callback.names) == sorted(weights)
    assert len(recorder.zero_shares) == 6
    for share in recorder.zero_shares:
        assert share == pytest.approx(0.8, abs=1.0 / flat.numel())
    for name, weight in expected_prunable(trainer.model).items():
        assert torch.equal(weight != 0, first_kept[name]), name  # the masks never moved
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged and all(entry["sparsity"] == pytest.approx(0.8, abs=1e-3) for entry in logged)


def test_acdc_follows_its_phases_and_resets_the_pruned_moments(tmp_path):
    callback = SparsityCallback(sparsity=0.6, spec=SPEC)
    _, recorder = _train(tmp_path, tiny_bert(), token_data(), callback, steps=20)
    # AC/DC over 20 steps, worked by hand from its definition: dense warm-up [0, 2), phases
    # of 1 step alternating C, D from step 2 over the 13 middle steps (C at 2, 4, ..., 14),
    # the last dense phase [15, 17), the final compressed phase [17, 20). The recorder sees
    # step i's weights after the callback re-masked them (step i compressed) and entered the
    # phase of step i + 1 (compressing now if it is compressed).
    compressed = {2, 4, 6, 8, 10, 12, 14, 17, 18, 19}
    assert len(recorder.zero_shares) == 20
    for index, share in enumerate(recorder.zero_shares):
        was, entering = index in compressed, min(index + 1, 19) in compressed
        if was or entering:
            assert share == pytest.approx(0.6, abs=0.01), index
        else:
            assert share < 0.1, index  # a dense step moves every revived weight off zero
        if entering and not was:  # a compression resets exp_avg of the pruned weights
            assert recorder.pruned_first_moments[index] == 0.0, index
    assert sum(1 for i in range(20) if i + 1 in compressed and i not in compressed) == 8


def test_gpt2_conv1d_weights_are_pruned_and_the_tied_embedding_is_not(tmp_path):
    model = tiny_gpt2()
    callback = SparsityCallback(sparsity=0.5, schedule="fixed", spec=SPEC)
    _train(tmp_path, model, token_data(lm=True), callback, steps=3)
    assert sorted(callback.names) == sorted(expected_prunable(model))
    assert not any("wte" in name or "lm_head" in name for name in callback.names)
    assert float((model.transformer.wte.weight == 0).float().mean()) == 0.0


def test_resuming_from_a_checkpoint_restores_masks_and_schedule_bitwise(tmp_path):
    whole = tmp_path / "whole"
    first, _ = _train(
        whole, tiny_bert(), token_data(), SparsityCallback(sparsity=0.6, spec=SPEC), steps=12
    )
    assert (whole / "checkpoint-4" / STATE_FILE).is_file()
    assert (whole / "checkpoint-4" / f"{STATE_FILE}.sha256").is_file()
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(whole / "checkpoint-4", resumed_dir / "checkpoint-4")
    callback = SparsityCallback(sparsity=0.6, spec=SPEC)
    second, _ = _train(resumed_dir, tiny_bert(), token_data(), callback, steps=12,
                       resume=str(resumed_dir / "checkpoint-4"))  # fmt: skip
    assert callback.masked.step == 12
    for (name, a), b in zip(first.model.state_dict().items(), second.model.state_dict().values(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name


def test_resuming_without_the_sparsity_state_is_one_sentence(tmp_path):
    whole = tmp_path / "whole"
    _train(whole, tiny_bert(), token_data(), SparsityCallback(sparsity=0.6, spec=SPEC), steps=4)
    (whole / "checkpoint-4" / STATE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"resumes at step 4 but .* does not exist"):
        _train(whole, tiny_bert(), token_data(), SparsityCallback(sparsity=0.6, spec=SPEC), steps=8,
               resume=str(whole / "checkpoint-4"))  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sparsity": 1.0}, "sparsity"),
        ({"sparsity": 0.5, "schedule": "gradual"}, "schedule='gradual' is not supported"),
        ({"sparsity": 0.5, "spec": "global"}, "spec must be a MaskSpec"),
    ],
)
def test_bad_options_are_one_sentence(options, message):
    with pytest.raises(ValueError, match=message):
        SparsityCallback(**options)


@pytest.mark.distributed
def test_two_gloo_ranks_hold_identical_masks_and_weights(tmp_path):
    output = tmp_path / "result.pt"
    torchrun("tests.train.sparsity_ddp_worker", str(output), str(tmp_path / "scratch"),
             processes=2)  # fmt: skip
    ranks = [torch.load(f"{output}.rank{rank}", weights_only=True) for rank in range(2)]
    masks = ranks[0]["masks"]
    assert masks
    pruned = sum(int((mask == 0).sum()) for mask in masks.values())
    assert pruned / sum(mask.numel() for mask in masks.values()) == pytest.approx(0.7, abs=1e-3)
    for name, mask in masks.items():
        assert torch.equal(mask, ranks[1]["masks"][name]), name
    for name, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][name]), name
