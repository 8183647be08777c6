"""Run by a test under ``torchrun``: Wanda and SparseGPT block by block, each rank calibrating
on different batches; every rank saves its masks and weights."""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from convergent.sparse import MaskSpec, prune_one_shot
from convergent.train import distributed
from tests.sparse.test_blockwise import MODELS, SPARSEGPT_OPTIONS, calibration

# our Transformer only: importing transformers would cost each rank seconds, and the sums
# over ranks do not depend on the model
CASES = ("ours/wanda", "ours/sparsegpt")
RANK_BATCHES = {0: [0, 1], 1: [2]}  # of calibration(): uneven, so a mean would not do


def run_case(case: str, batches: list[dict[str, Tensor]]) -> tuple[dict, dict]:
    """Prune a fresh model of ``case`` ("model/method") on ``batches``: (masks, state)."""
    which, method = case.split("/")
    model = MODELS[which][0]()
    options = SPARSEGPT_OPTIONS if method == "sparsegpt" else None
    report = prune_one_shot(model, 0.5, spec=MaskSpec(include_first=True), method=method,
                            calibration=batches, options=options)  # fmt: skip
    return report.masks.state_dict(), model.state_dict()


def main(output: str) -> None:
    distributed.init_from_environment(backend="gloo")
    assert distributed.world_size() == 2
    rank = distributed.rank()
    batches = [calibration()[index] for index in RANK_BATCHES[rank]]
    results = {}
    for case in CASES:
        masks, state = run_case(case, batches)
        results[case] = {"masks": masks, "state": state}
    torch.save(results, f"{output}.rank{rank}")
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
