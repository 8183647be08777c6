from __future__ import annotations

import pytest
import torch

from convergent.constrained import DescentConstraints, DualAscent, DualCadence
from convergent.diagnostics import layerwise_losses
from convergent.models import Transformer, TransformerConfig
from convergent.train import TrainingStep, fit
from convergent.train.primal_dual import PrimalDualStep, descent_step
from tests.conftest import TensorDataset


def _model(layers: int = 3, seed: int = 0, task: str = "classification") -> Transformer:
    torch.manual_seed(seed)
    config = TransformerConfig(
        task=task, vocab_size=40, num_outputs=2, d_model=16, n_heads=2, n_layers=layers, max_len=8
    )
    return Transformer(config)


def _data(n: int = 64, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (n, 8), generator=generator)
    labels = (ids[:, 0] < 20).long()
    return TensorDataset(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)


def _fit(model, step, data, steps=6, **options):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return fit(
        model,
        optimizer,
        data,
        max_steps=steps,
        batch_size=16,
        training_step=step,
        progress=False,
        tensorboard=False,
        **options,
    )


def test_the_step_is_a_training_step_and_its_metrics_are_logged():
    model = _model()
    step = descent_step("classification", model.num_layers, alpha=0.05, dual_lr=0.5)
    assert isinstance(step, TrainingStep)
    result = _fit(model, step, _data())
    record = result.history[-1]
    for key in ("objective", "lagrangian", "layer_loss_0", "layer_loss_3", "slack_1", "lambda_3"):
        assert key in record
    assert record["loss"] == record["objective"]
    assert any(record[f"lambda_{layer}"] > 0 for layer in (1, 2, 3))


def test_loss_is_the_lagrangian_of_the_model_layer_losses():
    model = _model()
    step = descent_step("classification", 3, alpha=0.1, dual_lr=1.0)
    step.dual.step(torch.tensor([0.5, 0.0, 0.25]))
    batch = _data(8).tensors
    value, metrics = step.loss(model, batch)
    losses = layerwise_losses(model, batch)
    slacks = losses[1:] - 0.9 * losses[:-1]
    expected = losses[-1] + 0.5 * slacks[0] + 0.25 * slacks[2]
    torch.testing.assert_close(value, expected)
    assert metrics["layer_loss_2"] == pytest.approx(float(losses[2].detach()))


def test_every_k_cadence_ascends_on_the_running_average():
    model = _model()
    step = descent_step("classification", 3, dual_lr=1.0, cadence="every", interval=3)
    observed = []
    original = step.loss

    def recording_loss(model, batch):
        value, metrics = original(model, batch)
        observed.append(torch.tensor([metrics[f"slack_{i}"] for i in (1, 2, 3)]))
        return value, metrics

    step.loss = recording_loss  # type: ignore[method-assign]
    result = _fit(model, step, _data(), steps=4)
    lambdas = [[r[f"lambda_{i}"] for i in (1, 2, 3)] for r in result.history]
    assert lambdas[0] == lambdas[1] == [0.0, 0.0, 0.0]
    expected = torch.stack(observed[:3]).mean(dim=0).clamp(min=0)
    assert float(expected.max()) > 0
    torch.testing.assert_close(torch.tensor(lambdas[2]), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step.dual.value(), expected, atol=1e-6, rtol=1e-5)


def test_epoch_cadence_ascends_on_a_full_pass():
    model = _model()
    data = _data(64)
    step = descent_step(
        "classification", 3, dual_lr=1.0, cadence="epoch", interval=4, full_pass_data=data
    )
    _fit(model, step, data, steps=4)
    expected = step.full_pass_slacks(model, data).clamp(min=0)
    torch.testing.assert_close(step.dual.value(), expected, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="needs full_pass_data"):
        descent_step("classification", 3, cadence="epoch", interval=4)


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    def run(steps, run_dir, resume=False):
        model = _model(seed=1)
        step = descent_step(
            "classification",
            3,
            alpha=0.05,
            dual_lr=0.5,
            resilient_cost=2.0,
            cadence="every",
            interval=2,
        )
        _fit(model, step, _data(), steps=steps, run_dir=run_dir, checkpoint_every=3, resume=resume)
        return model, step

    whole_model, whole_step = run(6, tmp_path / "whole")
    run(3, tmp_path / "split")
    resumed_model, resumed_step = run(6, tmp_path / "split", resume=True)
    for (name, value), other in zip(
        whole_model.state_dict().items(), resumed_model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(other, value, msg=name)
    torch.testing.assert_close(resumed_step.dual.value(), whole_step.dual.value())
    torch.testing.assert_close(resumed_step.dual.slack(), whole_step.dual.slack())


def test_layer_sampling_reads_out_only_the_drawn_layers():
    model = _model(layers=4)
    step = descent_step("classification", 4, dual_lr=0.5, layers_per_step=1, seed=3)
    result = _fit(model, step, _data(), steps=3)
    assert len(step.last_result.layers) == 2 and step.last_result.layers[-1] == 4
    assert sum(key.startswith("layer_loss_") for key in result.history[-1]) == 2
    with pytest.raises(ValueError, match=r"layers_per_step is 5; it must be in \[1, 4\]"):
        descent_step("classification", 4, layers_per_step=5)


def test_mismatched_layer_count_and_non_finite_losses_are_named():
    model = _model(layers=2)
    step = descent_step("classification", 3)
    with pytest.raises(ValueError, match="returned 3 hidden states; the constraints expect 4"):
        step.loss(model, _data(8).tensors)
    with pytest.raises(ValueError, match="3 multipliers for 2 constraints"):
        PrimalDualStep("classification", DescentConstraints(2), DualAscent(3), DualCadence())
    step = descent_step("classification", 2)
    with torch.no_grad():
        for parameter in model.blocks[1].parameters():
            parameter.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="loss at layer 2 is nan"):
        step.loss(model, _data(8).tensors)


@pytest.mark.parametrize("task", ["classification", "lm"])
def test_full_pass_losses_over_ragged_batches_equal_one_batch_of_everything(task):
    """70 examples in batches of 16 (the last holds 6): the full-pass per-layer losses are the
    mean over examples (over valid tokens for lm) of one pass over all 70 at once. Keeping only
    the first batch, or averaging the batch means unweighted, gives other numbers."""
    import torch.nn.functional as F

    from convergent.train.primal_dual import dataset_layer_losses

    torch.manual_seed(0)
    config = TransformerConfig(task=task, vocab_size=40, num_outputs=2 if task != "lm" else 40,
                               d_model=16, n_heads=2, n_layers=3, max_len=8,
                               causal=task == "lm")  # fmt: skip
    model = Transformer(config).eval()
    with torch.no_grad():  # larger weights: per-example losses differ, so batches differ
        for parameter in model.parameters():
            parameter.mul_(4.0)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (70, 8), generator=generator)
    if task == "lm":
        labels = torch.randint(0, 40, (70, 8), generator=generator)
        # ragged token counts: each batch of 16 ignores a different number of positions
        for i in range(70):
            ignored = min(7, 2 * (i // 16))
            if ignored:
                labels[i, -ignored:] = -100
    else:
        labels = (ids[:, 0] < 20).long()
    data = TensorDataset(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)

    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       output_hidden_states=True).hidden_states  # fmt: skip
        expected = []
        for state in hidden:
            logits = model.readout(state, torch.ones_like(ids))
            expected.append(
                F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
                )
            )
    expected = torch.stack(expected)
    measured = dataset_layer_losses(model, data, task, batch_size=16)
    torch.testing.assert_close(measured, expected, rtol=1e-5, atol=1e-6)
    first = TensorDataset(**{key: value[:16] for key, value in data.tensors.items()})
    first_batch_only = dataset_layer_losses(model, first, task, batch_size=16)
    assert (first_batch_only - expected).abs().max() > 1e-3  # the test can tell them apart
    step = descent_step(task, 3, cadence="epoch", interval=1, full_pass_data=data, alpha=0.1)
    slacks = step.full_pass_slacks(model, data)
    torch.testing.assert_close(slacks, expected[1:] - 0.9 * expected[:-1], rtol=1e-4, atol=1e-6)
