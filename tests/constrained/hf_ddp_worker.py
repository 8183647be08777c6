"""Run under ``torchrun``: DescentTrainer on a tiny BERT; every rank saves its multipliers.

With N processes the per-device batch is 8 / N, so every run sees the same global batch.
"""

from __future__ import annotations

import os
import sys

import torch
import transformers

from convergent.train import distributed
from convergent.train.primal_dual_hf import DescentTrainer
from tests.constrained.tiny_bert import tiny_bert_descent


def main(output: str, scratch: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model, data, step = tiny_bert_descent(32)
    args = transformers.TrainingArguments(
        output_dir=scratch, per_device_train_batch_size=8 // world, learning_rate=1e-3,
        max_steps=4, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        ddp_backend="gloo", logging_steps=1,
    )  # fmt: skip
    DescentTrainer(model=model, args=args, train_dataset=data, descent=step).train()
    torch.save({"lambda": step.dual.value(), "steps": step.steps},
               f"{output}.rank{distributed.rank()}")  # fmt: skip
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
