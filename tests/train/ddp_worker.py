"""Run by tests under ``torchrun``: train a tiny model; every rank saves its weights and the
examples it trained on and evaluated."""

from __future__ import annotations

import sys

import torch

from convergent.train import distributed, fit
from tests.conftest import RecordingDataset, TinyClassifier, make_classification


def main(output: str, processes: str) -> None:
    distributed.init_from_environment(backend="gloo")
    assert distributed.world_size() == int(processes)
    torch.manual_seed(0)
    model = TinyClassifier(dropout=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train = RecordingDataset(make_classification())
    # larger than evaluate's batch (256) x 2 ranks, so that every rank evaluates examples
    evaluation = RecordingDataset(make_classification(n=601, seed=1))
    result = fit(
        model,
        optimizer,
        train,
        eval_data=evaluation,
        max_steps=8,
        batch_size=16,
        grad_clip=1.0,
        progress=False,
        seed=5,
    )
    saved = {"state": model.state_dict(), "evaluation": result.evaluation,
             "train_served": train.served, "eval_served": evaluation.served}  # fmt: skip
    torch.save(saved, f"{output}.rank{distributed.rank()}")
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
