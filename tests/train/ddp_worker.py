"""Run by tests under ``torchrun``: train a tiny model, save the final weights from rank 0."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from convergent.train import distributed, fit
from tests.conftest import TinyClassifier, make_classification


def main(output: str) -> None:
    distributed.init_from_environment(backend="gloo")
    torch.manual_seed(0)
    model = TinyClassifier(dropout=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    result = fit(
        model,
        optimizer,
        make_classification(),
        eval_data=make_classification(n=37, seed=1),
        max_steps=8,
        batch_size=16,
        grad_clip=1.0,
        progress=False,
        seed=5,
    )
    if distributed.is_main_process():
        torch.save({"state": model.state_dict(), "evaluation": result.evaluation}, output)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
