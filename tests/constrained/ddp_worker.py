"""Run under ``torchrun``: primal-dual training of a tiny Transformer; rank 0 saves the result.

Two runs, one with the dual step every 2 steps on the running average and one once per
epoch on a full pass. Every rank saves its own multipliers, so the test can check they agree across ranks.
"""

from __future__ import annotations

import sys

import torch

from convergent.models import Transformer, TransformerConfig
from convergent.train import distributed, fit
from convergent.train.primal_dual import descent_step
from tests.conftest import RecordingDataset, TensorDataset

FULL_PASS_EXAMPLES = 600  # more than the full pass's batch (256) x 2 ranks


def _tokens(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (count, 8), generator=generator)
    return TensorDataset(
        input_ids=ids, attention_mask=torch.ones_like(ids), labels=(ids[:, 0] < 20).long()
    )


def train(cadence: str) -> dict:
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=40, num_outputs=2, d_model=16, n_heads=2, n_layers=3, max_len=8
    )
    model = Transformer(config)
    data = RecordingDataset(_tokens(64, seed=0))
    full_pass = RecordingDataset(_tokens(FULL_PASS_EXAMPLES, seed=1))
    step = descent_step(
        "classification",
        3,
        alpha=0.05,
        dual_lr=0.5,
        resilient_cost=2.0,
        cadence=cadence,
        interval=2 if cadence != "step" else 1,
        full_pass_data=full_pass if cadence == "epoch" else None,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fit(
        model,
        optimizer,
        data,
        max_steps=6,
        batch_size=16,
        training_step=step,
        progress=False,
        tensorboard=False,
        seed=3,
    )
    return {"state": model.state_dict(), "lambda": step.dual.value(), "u": step.dual.slack(),
            "train_served": data.served, "full_pass_served": full_pass.served}  # fmt: skip


def main(output: str, processes: str) -> None:
    distributed.init_from_environment(backend="gloo")
    assert distributed.world_size() == int(processes)
    results = {cadence: train(cadence) for cadence in ("every", "epoch")}
    torch.save(results, f"{output}.rank{distributed.rank()}")
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
