from __future__ import annotations

import pytest
import torch

from convergent.data import load_rt_sentences, minilm_path, tokenize
from convergent.models import HFEncoder
from convergent.train.primal_dual import descent_step
from tests.conftest import TensorDataset, tiny_bert_config
from tests.constrained.tiny_bert import tiny_bert_descent

transformers = pytest.importorskip("transformers")


def _sentences(count: int = 16) -> TensorDataset:
    texts, scores = load_rt_sentences()
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
    encoded = tokenize(texts[:count], tokenizer, max_length=16)
    return TensorDataset(**encoded, labels=(scores[:count] > 0).long())


def _args(tmp_path, **options):
    settings = {"per_device_train_batch_size": 4, "learning_rate": 1e-4, "max_steps": 3,
                "logging_steps": 1, "report_to": [], "use_cpu": True, "save_strategy": "no",
                "disable_tqdm": True}  # fmt: skip
    return transformers.TrainingArguments(output_dir=str(tmp_path), **{**settings, **options})


def test_descent_trainer_trains_minilm_with_constraints_in_a_few_lines(tmp_path):
    from convergent.train.primal_dual_hf import DescentTrainer

    torch.manual_seed(0)
    model = HFEncoder.from_pretrained(
        minilm_path(), num_outputs=2, pooling="mean", attn_implementation="sdpa"
    )
    before = model.encoder.embeddings.word_embeddings.weight.detach().clone()
    step = descent_step("classification", model.num_layers, alpha=0.05, dual_lr=1.0)
    trainer = DescentTrainer(
        model=model, args=_args(tmp_path), train_dataset=_sentences(), descent=step
    )
    trainer.train()
    assert step.steps == 3  # one dual update per optimizer step
    logged = [entry for entry in trainer.state.log_history if "lambda_1" in entry]
    assert len(logged) == 3
    assert {"objective", "layer_loss_0", "layer_loss_6", "slack_6", "lambda_6"} <= set(logged[-1])
    assert any(value > 0 for value in step.dual.value().tolist())
    after = model.encoder.embeddings.word_embeddings.weight.detach()
    assert not torch.equal(before, after)


def test_sequence_classification_readout_reproduces_the_model_logits():
    from transformers import BertForSequenceClassification

    from convergent.losses import sequence_classification_readout

    config = tiny_bert_config(num_labels=3)
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(0, 50, (2, 8))
    output = model(input_ids=ids, output_hidden_states=True)
    readout = sequence_classification_readout(model)
    torch.testing.assert_close(readout(output.hidden_states[-1]), output.logits)
    step = descent_step("classification", 2)
    step.readout = readout
    value, metrics = step.loss(model, {"input_ids": ids, "labels": torch.tensor([0, 2])})
    assert torch.isfinite(value) and "layer_loss_1" in metrics


def test_sequence_classification_readout_reproduces_roberta_logits():
    # RoBERTa's head takes the whole sequence and picks the first token itself.
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from convergent.losses import sequence_classification_readout

    config = RobertaConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=20, num_labels=3)  # fmt: skip
    torch.manual_seed(0)
    model = RobertaForSequenceClassification(config).eval()
    ids = torch.randint(3, 60, (2, 8))
    output = model(input_ids=ids, output_hidden_states=True)
    readout = sequence_classification_readout(model)
    torch.testing.assert_close(readout(output.hidden_states[-1]), output.logits)


def _tiny_bert_trainer(tmp_path, **options):
    from convergent.train.primal_dual_hf import DescentTrainer

    model, data, step = tiny_bert_descent(16)
    args = _args(tmp_path, **options)
    return DescentTrainer(model=model, args=args, train_dataset=data, descent=step), step


def test_descent_trainer_resume_restores_lambda_and_continues_exactly(tmp_path):
    options = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2}
    trainer, step = _tiny_bert_trainer(tmp_path / "whole", **options)
    trainer.train()
    assert (tmp_path / "whole" / "checkpoint-2" / "descent_state.pt").is_file()
    assert step.dual.value().abs().sum() > 0  # the test means something only if lambda moved

    # A fresh trainer resumes from step 2: lambda comes back from the checkpoint, not from 0.
    resumed_trainer, resumed = _tiny_bert_trainer(tmp_path / "whole", **options)
    resumed_trainer.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    assert resumed.steps == step.steps
    torch.testing.assert_close(resumed.dual.value(), step.dual.value())
    for ours, theirs in zip(
        resumed_trainer.model.parameters(), trainer.model.parameters(), strict=True
    ):
        torch.testing.assert_close(ours, theirs)


def test_descent_trainer_refuses_to_resume_without_dual_state(tmp_path):
    trainer, _ = _tiny_bert_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    trainer.train()
    (tmp_path / "checkpoint-2" / "descent_state.pt").unlink()
    fresh, _ = _tiny_bert_trainer(tmp_path, max_steps=2)
    with pytest.raises(FileNotFoundError, match="holds no descent state"):
        fresh.train(resume_from_checkpoint=True)
