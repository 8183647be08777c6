"""Run by tests under ``torchrun``: AC/DC with HORST; every rank saves its masks and weights."""

from __future__ import annotations

import sys

import torch

from convergent.optim import HORST
from convergent.sparse import ACDCSchedule, MaskSpec
from convergent.train import ErmStep, distributed, fit
from convergent.train.masked import MaskedStep
from tests.conftest import RecordingDataset, make_classification
from tests.sparse.test_enforce import ThreeLayers


def main(output: str, processes: str) -> None:
    distributed.init_from_environment(backend="gloo")
    assert distributed.world_size() == int(processes)
    torch.manual_seed(0)
    model = ThreeLayers()
    optimizer = HORST(model.parameters(), lr=2e-2, weight_decay=0.05)
    names = MaskSpec(include_first=True, include_last=True).select(model).names
    masked = MaskedStep(ErmStep("classification"), optimizer, names, sparsity=0.75,
                        schedule=ACDCSchedule(30), reset="momentum")  # fmt: skip
    data = RecordingDataset(make_classification())
    fit(model, optimizer, data, max_steps=30, batch_size=16,
        training_step=masked, progress=False, seed=5, tensorboard=False)  # fmt: skip
    assert masked.masks is not None
    torch.save(
        {
            "masks": masked.masks.state_dict(),
            "state": model.state_dict(),
            "compressions": masked.compressions,
            "train_served": data.served,
        },
        f"{output}.rank{distributed.rank()}",
    )
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
