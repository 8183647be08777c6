"""Gradual magnitude pruning in the training loop: MaskedStep with a GradualSchedule."""

from __future__ import annotations

import itertools

import pytest
import torch

from convergent.data import load_splits
from convergent.models import Transformer, TransformerConfig
from convergent.optim import HORST
from convergent.sparse import GradualSchedule, MaskSpec
from convergent.train import ErmStep, MaskedStep, fit


def test_gmp_follows_its_cubic_schedule_and_keeps_pruned_weights_at_zero():
    splits = load_splits("digits", seed=0)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(task="classification", num_outputs=10,
                                          input_dim=splits.input_dim, max_len=splits.seq_len,
                                          d_model=32, n_heads=2, n_layers=2, d_ff=64))  # fmt: skip
    optimizer = HORST(model.parameters(), lr=1e-3)
    spec = MaskSpec(distribution="global")  # one threshold: the count is exact over all names
    names = spec.select(model).names
    schedule = GradualSchedule(0.8, start_step=5, end_step=25, frequency=5)
    masked = MaskedStep(ErmStep("classification"), optimizer, names, sparsity=0.8,
                        schedule=schedule, spec=spec)  # fmt: skip
    parameters = dict(model.named_parameters())
    total = sum(parameters[name].numel() for name in names)
    seen: list[tuple[int, float, torch.Tensor]] = []

    class Record:
        def on_step_end(self, step, metrics):
            zero = torch.cat([(parameters[n] == 0).flatten() for n in names])
            seen.append((step, float(zero.float().mean()), zero.clone()))

    result = fit(model, optimizer, splits.train, max_steps=40, batch_size=32, progress=False,
                 tensorboard=False, training_step=masked, callbacks=[Record()])  # fmt: skip
    for step, achieved, _ in seen:
        # after `step` steps the masks serve the step with index `step`: the cubic formula
        # s_f + (s_i - s_f)(1 - (t - t0) / (n dt))^3 at the last update t <= step, written here
        t = 5 + min(max(step - 5, 0) // 5, 4) * 5
        want = 0.0 if step < 5 else 0.8 - 0.8 * (1 - (t - 5) / 20) ** 3
        assert achieved == pytest.approx(want, abs=0.5 / total + 1e-12), step
    for (_, _, before), (step, _, after) in itertools.pairwise(seen):
        if step > 5:
            assert bool(after[before].all()), step  # a pruned weight stays pruned
    assert result.warnings == []  # the check: 80 % reached at the end


def test_gmp_needs_its_final_sparsity_to_be_the_target():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"the GradualSchedule ends at 0\.8, but sparsity is 0\.9"):
        MaskedStep(None, optimizer, ["0.weight"], sparsity=0.9,
                   schedule=GradualSchedule(0.8, 0, 10))  # fmt: skip
