"""Run by a test under ``torchrun``: every pruner block by block (uniform and OWL), each rank
calibrating on different batches; every rank saves its masks and weights."""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from convergent.sparse import PRUNERS, MaskSpec, prune_one_shot
from convergent.train import distributed
from tests.sparse.test_blockwise import MODELS, SPARSEGPT_OPTIONS, calibration

# our Transformer only: importing transformers would cost each rank seconds, and the sums
# over ranks do not depend on the model. "model/method/distribution", every pruner.
CASES = tuple(
    f"ours/{method}/{distribution}" for method in PRUNERS for distribution in ("uniform", "owl")
)
RANK_BATCHES = {0: [0, 1], 1: [2]}  # of calibration(): uneven, so a mean would not do


def run_case(case: str, batches: list[dict[str, Tensor]]) -> tuple[dict, dict]:
    """Prune a fresh model of ``case`` on ``batches``: (masks, state)."""
    which, method, distribution = case.split("/")
    model = MODELS[which][0]()
    options = SPARSEGPT_OPTIONS if method == "sparsegpt" else None
    spec = MaskSpec(include_first=True, distribution=distribution, owl_m=2.0)
    report = prune_one_shot(model, 0.5, spec=spec, method=method, calibration=batches,
                            options=options)  # fmt: skip
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
