"""Run under ``torchrun``: a plain Trainer with SparsityCallback on a tiny BERT; every rank
saves its masks and final weights."""

from __future__ import annotations

import os
import sys

import torch
import transformers

from convergent.train import distributed
from convergent.train.sparse_hf import SparsityCallback
from tests.train.test_sparsity_callback_hf import SPEC, tiny_bert, token_data


def main(output: str, scratch: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = transformers.TrainingArguments(
        output_dir=scratch, per_device_train_batch_size=8 // world, learning_rate=1e-3,
        max_steps=10, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        ddp_backend="gloo", logging_steps=1,
    )  # fmt: skip
    callback = SparsityCallback(sparsity=0.7, spec=SPEC)
    model = tiny_bert()
    transformers.Trainer(
        model=model, args=args, train_dataset=token_data(32), callbacks=[callback]
    ).train()
    assert callback.masked is not None and callback.masked.masks is not None
    torch.save(
        {"masks": callback.masked.masks.state_dict(), "state": model.state_dict()},
        f"{output}.rank{distributed.rank()}",
    )
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
