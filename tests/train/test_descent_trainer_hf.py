"""DescentTrainer with a plain Hugging Face classifier, and its checksummed dual state."""

from __future__ import annotations

import hashlib
import logging
import shutil

import pytest
import torch

from convergent.train import CheckpointError
from convergent.train.primal_dual import descent_step
from tests.conftest import TensorDataset

transformers = pytest.importorskip("transformers")


def _plain_bert() -> torch.nn.Module:
    """A tiny BertForSequenceClassification from a config: no download, no readout attribute."""
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def _data(examples: int = 16) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        input_ids=torch.randint(0, 100, (examples, 8), generator=generator),
        attention_mask=torch.ones(examples, 8, dtype=torch.long),
        labels=torch.randint(0, 2, (examples,), generator=generator),
    )


def _trainer(output_dir, readout=None, **options):
    from convergent.train.primal_dual_hf import DescentTrainer

    settings = {"per_device_train_batch_size": 4, "learning_rate": 1e-3, "max_steps": 4,
                "logging_steps": 1, "report_to": [], "use_cpu": True, "save_strategy": "steps",
                "save_steps": 2, "disable_tqdm": True}  # fmt: skip
    args = transformers.TrainingArguments(output_dir=str(output_dir), **{**settings, **options})
    step = descent_step("classification", 2, alpha=0.5, dual_lr=1.0)
    model = _plain_bert()
    assert not hasattr(model, "readout")
    trainer = DescentTrainer(
        model=model, args=args, train_dataset=_data(), descent=step, readout=readout
    )
    return trainer, step


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 4-step run with checkpoints at steps 2 and 4: (its folder, its final step)."""
    folder = tmp_path_factory.mktemp("descent_run")
    trainer, step = _trainer(folder)
    trainer.train()
    return folder, step


# Defect 5: a plain *ForSequenceClassification model needs no readout attribute.


def test_a_plain_bert_classifier_trains_and_its_multipliers_move(trained):
    folder, step = trained
    assert step.steps == 4 and step.readout is not None
    assert step.dual.value().abs().sum() > 0  # lambda moved away from its init 0
    for checkpoint in ("checkpoint-2", "checkpoint-4"):
        assert (folder / checkpoint / "descent_state.pt").is_file()
        assert (folder / checkpoint / "descent_state.pt.sha256").is_file()


def test_resuming_a_plain_bert_classifier_restores_the_multipliers(trained, tmp_path):
    folder, step = trained
    shutil.copytree(folder / "checkpoint-2", tmp_path / "checkpoint-2")
    saved = torch.load(tmp_path / "checkpoint-2" / "descent_state.pt", weights_only=True)
    assert saved["dual"] and saved["steps"] == 2

    resumed_trainer, resumed = _trainer(tmp_path)
    resumed_trainer.load_descent_state(tmp_path / "checkpoint-2")
    assert resumed.steps == 2 and resumed.dual.value().abs().sum() > 0  # not reset to 0

    resumed_trainer, resumed = _trainer(tmp_path)
    resumed_trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.steps == step.steps
    torch.testing.assert_close(resumed.dual.value(), step.dual.value())


def test_an_explicit_readout_argument_is_the_one_used(tmp_path):
    from convergent.losses import sequence_classification_readout

    calls = []

    def counting_readout(hidden_state, attention_mask=None):
        calls.append(tuple(hidden_state.shape))
        return head(hidden_state, attention_mask)

    trainer, step = _trainer(tmp_path, readout=counting_readout, max_steps=1, save_strategy="no")
    head = sequence_classification_readout(trainer.model)
    assert step.readout is counting_readout
    trainer.train()
    assert calls == [(4, 8, 32), (4, 8, 32)]  # layers 0 and 1 of one step; L from the logits


def test_a_model_without_readout_or_classifier_is_one_sentence(tmp_path):
    from convergent.train.primal_dual_hf import DescentTrainer

    model = transformers.BertModel(_plain_bert().config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="BertModel has no classifier module; pass readout="):
        DescentTrainer(model=model, args=args, descent=descent_step("classification", 2))


# Defect 4: the dual state carries a sha256 and loads as one sentence when damaged.


def _copy_checkpoint(trained, tmp_path):
    folder, _ = trained
    target = tmp_path / "checkpoint-2"
    shutil.copytree(folder / "checkpoint-2", target)
    return target


def _assert_one_sentence(error: CheckpointError) -> None:
    message = str(error)
    assert "weights_only" not in message and "\n" not in message
    assert "descent_state.pt" in message


def test_a_flipped_byte_in_the_descent_state_is_a_checkpoint_error(trained, tmp_path):
    checkpoint = _copy_checkpoint(trained, tmp_path)
    path = checkpoint / "descent_state.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    trainer, _ = _trainer(tmp_path)
    with pytest.raises(CheckpointError, match="does not match the sha256") as raised:
        trainer.load_descent_state(checkpoint)
    _assert_one_sentence(raised.value)


def test_a_descent_state_with_pickled_code_is_a_checkpoint_error(trained, tmp_path):
    checkpoint = _copy_checkpoint(trained, tmp_path)
    path = checkpoint / "descent_state.pt"
    torch.save({"steps": print}, path)  # checksummed correctly, but not plain data
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (checkpoint / "descent_state.pt.sha256").write_text(f"{digest}  descent_state.pt\n")
    trainer, _ = _trainer(tmp_path)
    with pytest.raises(CheckpointError, match="corrupt or not a convergent checkpoint") as raised:
        trainer.load_descent_state(checkpoint)
    _assert_one_sentence(raised.value)


def test_a_descent_state_without_checksum_loads_with_a_warning(trained, tmp_path, caplog):
    checkpoint = _copy_checkpoint(trained, tmp_path)
    (checkpoint / "descent_state.pt.sha256").unlink()  # as written by an earlier version
    trainer, step = _trainer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="convergent.train.checkpoint"):
        trainer.load_descent_state(checkpoint)
    assert step.steps == 2
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "unverified" in record.getMessage()
