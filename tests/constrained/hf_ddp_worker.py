"""Run under ``torchrun``: DescentTrainer on a tiny BERT; every rank saves its multipliers.

With N processes the per-device batch is 8 / N, so every run sees the same global batch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import transformers
from transformers import BertConfig, BertForSequenceClassification

from convergent.train import distributed
from convergent.train.primal_dual import descent_step
from convergent.train.primal_dual_hf import DescentTrainer, sequence_classification_readout
from tests.conftest import TensorDataset


def main(output: str, scratch: str) -> None:
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        input_ids=torch.randint(0, 50, (32, 8), generator=generator),
        attention_mask=torch.ones(32, 8, dtype=torch.long),
        labels=torch.randint(0, 2, (32,), generator=generator),
    )
    step = descent_step("classification", 2, alpha=0.5, dual_lr=1.0)
    step.readout = sequence_classification_readout(model)
    args = transformers.TrainingArguments(
        output_dir=scratch, per_device_train_batch_size=8 // world, learning_rate=1e-3,
        max_steps=4, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        ddp_backend="gloo", logging_steps=1,
    )  # fmt: skip
    DescentTrainer(model=model, args=args, train_dataset=data, descent=step).train()
    torch.save({"lambda": step.dual.value(), "steps": step.steps},
               f"{output}.rank{distributed.rank()}")  # fmt: skip
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
