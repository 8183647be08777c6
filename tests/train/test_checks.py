"""Live manipulation checks: each warning fires, once, where its method cannot act, and not
where it does. Expected values come from the run itself (a second run at s = 0, a formula in
the test), never from the check's own functions."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from convergent.data import load_splits
from convergent.diagnostics import acting
from convergent.models import Transformer, TransformerConfig
from convergent.optim import HAM, HORST, Langevin
from convergent.sparse import ACDCSchedule, MaskSpec
from convergent.train import ErmStep, MaskedStep, MethodChecks, fit
from convergent.train.primal_dual import descent_step
from tests.conftest import TensorDataset


@pytest.fixture(scope="module")
def digits():
    return load_splits("digits", seed=0)


def _model(splits, task: str = "classification", outputs: int = 10) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        TransformerConfig(
            task=task,  # type: ignore[arg-type]
            num_outputs=outputs,
            input_dim=splits.input_dim,
            max_len=splits.seq_len,
            d_model=32,
            n_heads=2,
            n_layers=2,
            d_ff=64,
            dropout=0.0,
        )
    )


def _checks(result) -> set[str]:
    return {record["check"] for record in result.warnings}


def _fit(model, optimizer, splits, steps=40, **options):
    return fit(model, optimizer, splits.train, max_steps=steps, batch_size=32, progress=False,
               tensorboard=False, **options)  # fmt: skip


# --- HORST and HAM ----------------------------------------------------------------------------


def test_horst_at_alpha_1_on_std_002_weights_warns_once_and_names_what_to_change(digits, caplog):
    model = _model(digits)
    with caplog.at_level(logging.WARNING, logger="convergent.train.checks"):
        result = _fit(model, HORST(model.parameters(), lr=1e-3, alpha=1.0), digits)
    assert [record["check"] for record in result.warnings] == ["mirror_acts"]
    warning = result.warnings[0]
    assert warning["value"] < acting.MOVE_RATIO_FLOOR
    assert "acting as AdamW" in warning["message"] and "now alpha 1" in warning["message"]
    assert [r.getMessage() for r in caplog.records] == [warning["message"]]  # one line, once
    ratios = [r["mirror_move_ratio"] for r in result.history if "mirror_move_ratio" in r]
    assert len(ratios) == 20 and max(ratios) < 0.05  # alpha x mean|theta| is about 0.016


def test_default_horst_acts_and_says_so(digits):
    model = _model(digits)
    result = _fit(model, HORST(model.parameters(), lr=1e-3), digits)
    assert result.warnings == []
    assert any(line.startswith("HORST acts: HORST's mirror step") for line in result.acting)


def test_ham_warns_below_its_floor_and_acts_above_it_and_an_overflow_says_so(digits):
    # mirror move about lr alpha |w| |grad|: on this model alpha 200 sits near the floor
    # (0.19), so a tenth of it is inert and ten times it acts
    model = _model(digits)
    weak = _fit(model, HAM(torch.optim.AdamW(model.parameters(), lr=1e-3), alpha=20.0), digits)
    assert _checks(weak) == {"mirror_acts"} and "now alpha 20" in weak.warnings[0]["message"]
    model = _model(digits)
    strong = HAM(torch.optim.AdamW(model.parameters(), lr=1e-3), alpha=2000.0)
    assert _fit(model, strong, digits).warnings == []
    model = _model(digits)
    # lr x alpha x |grad| far beyond 1: the mirror factor exp(...) overflows
    optimizer = HAM(torch.optim.AdamW(model.parameters(), lr=1.0), alpha=1e6, nonfinite="ignore")
    with pytest.raises(FloatingPointError):  # the loop stops at the non-finite loss
        _fit(model, optimizer, digits, steps=20)
    checks = MethodChecks(optimizer, max_steps=20, every=1)
    _, failed = checks.after_step(1, {}, model)
    assert [check.name for check in failed] == ["ham_finite"]


# --- Langevin ---------------------------------------------------------------------------------


class _Linear(torch.nn.Module):
    """Least squares: a convex problem, so a perturbation of the chain does not grow by
    itself (a small Transformer's training amplifies a 1e-12 noise to a few % of its
    outcome, which would say nothing about the noise's size)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(8, 1))

    def forward(self, inputs):
        return SimpleNamespace(logits=inputs @ self.weight)


def _regression() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 8, generator=generator)
    truth = torch.randn(8, 1, generator=generator)
    return TensorDataset(inputs=inputs, labels=inputs @ truth + 0.3 * torch.randn(256, 1))


def _langevin_run(data, s: float):
    model = _Linear()
    optimizer = Langevin(model.parameters(), lr=0.02, s=s, seed=0)
    result = fit(model, optimizer, data, max_steps=200, batch_size=32, task="regression",
                 progress=False, tensorboard=False)  # fmt: skip
    return result, model.weight.detach().flatten().clone()


def test_the_noise_check_fails_when_the_noise_moves_nothing_and_passes_when_it_does():
    data = _regression()
    _, still = _langevin_run(data, 0.0)
    cold, cold_weights = _langevin_run(data, 1e-12)
    hot, hot_weights = _langevin_run(data, 1e-3)
    # The outcome: how far the final weights lie from the noiseless run's, relative to how
    # far training moved them (from zero), measured here, not by the check.
    travel = float(still.norm())
    assert float((cold_weights - still).norm()) / travel < 0.01
    assert float((hot_weights - still).norm()) / travel > 0.01
    assert (
        _checks(cold) == {"noise_acts"} and "raise the temperature" in cold.warnings[0]["message"]
    )
    assert "noise_acts" not in _checks(hot)
    assert any(line.startswith("Langevin acts:") for line in hot.acting)


def test_a_hot_chain_after_a_fit_loses_it_and_says_so(digits):
    model = _model(digits)
    _fit(model, torch.optim.AdamW(model.parameters(), lr=3e-3), digits, steps=150)
    optimizer = Langevin(model.parameters(), lr=0.01, s=1.0, seed=0)
    result = _fit(model, optimizer, digits, steps=60)
    assert "fit_kept" in _checks(result)
    record = next(r for r in result.warnings if r["check"] == "fit_kept")
    assert record["value"] > acting.FIT_KEPT_LOSS_MULTIPLE
    train = [r["loss"] for r in result.history
             if r.get("split") == "train" and r["step"] <= record["step"]]  # fmt: skip
    first, last = sum(train[:3]) / 3, sum(train[-3:]) / 3  # every = 3 steps at 60 steps
    assert record["value"] == pytest.approx(last / first, rel=1e-9)


# --- descent ----------------------------------------------------------------------------------


def test_the_binding_check_reports_the_floor_it_missed():
    # lambda 0.38 but active in 19 % of the steps (the descent study's language model): the
    # share is what failed, so it is the value reported, and the run is not called ERM
    rare = acting.constraints_bind(0.38, 0.19)
    assert not rare.acted and (rare.value, rare.threshold) == (0.19, 0.2)
    assert "too few steps" in rare.advice and "ERM in all but name" not in rare.advice
    weak = acting.constraints_bind(0.097, 0.51)  # the denoiser: lambda below 0.1
    assert not weak.acted and (weak.value, weak.threshold) == (0.097, 0.1)
    assert "ERM in all but name" in weak.advice
    neither = acting.constraints_bind(0.05, 0.1)
    assert not neither.acted and (neither.value, neither.threshold) == (0.05, 0.1)
    bound = acting.constraints_bind(0.1, 0.2)  # each floor is inclusive
    assert bound.acted and (bound.value, bound.threshold) == (0.1, 0.1)


def test_slack_constraints_warn_that_they_do_not_bind(digits):
    model = _model(digits)
    # f_l <= (1 - alpha) f_(l-1) with alpha 0 and a tiny dual step: lambda stays near 0
    step = descent_step("classification", model.num_layers, alpha=0.0, dual_lr=1e-6)
    result = _fit(model, torch.optim.AdamW(model.parameters(), lr=1e-3), digits,
                  training_step=step)  # fmt: skip
    assert "constraints_bind" in _checks(result)
    lambdas = [max(r[f"lambda_{i}"] for i in (1, 2)) for r in result.history if "lambda_1" in r]
    assert max(lambdas) < acting.MULTIPLIER_FLOOR  # what the warning says, read from the run


def test_constraints_that_cannot_be_met_warn_they_are_never_met_and_still_growing(digits):
    model = _model(digits)
    step = descent_step("classification", model.num_layers, alpha=0.99, dual_lr=0.5)
    result = _fit(model, torch.optim.AdamW(model.parameters(), lr=1e-3), digits,
                  training_step=step)  # fmt: skip
    assert {"constraints_met", "multipliers_settled"} <= _checks(result)
    assert "constraints_bind" not in _checks(result)


def test_binding_constraints_pass(digits):
    model = _model(digits)
    step = descent_step("classification", model.num_layers, alpha=0.3, dual_lr=0.5,
                        resilient_cost=1.0)  # fmt: skip
    result = _fit(model, torch.optim.AdamW(model.parameters(), lr=1e-3), digits, steps=80,
                  training_step=step)  # fmt: skip
    assert "constraints_bind" not in _checks(result)


# --- sparsity ---------------------------------------------------------------------------------


def test_a_schedule_longer_than_the_run_warns_that_the_target_was_not_reached(digits):
    model = _model(digits)
    optimizer = HORST(model.parameters(), lr=1e-3)
    names = MaskSpec().select(model).names
    masked = MaskedStep(ErmStep("classification"), optimizer, names, sparsity=0.9,
                        schedule=ACDCSchedule(total_steps=400))  # fmt: skip
    result = _fit(model, optimizer, digits, steps=30, training_step=masked)
    assert _checks(result) == {"sparsity_reached"}
    zeros = sum(int((dict(model.named_parameters())[n] == 0).sum()) for n in names)
    total = sum(dict(model.named_parameters())[n].numel() for n in names)
    assert result.warnings[0]["value"] == pytest.approx(zeros / total)  # about 0: all dense


def test_acdc_over_the_run_reaches_its_target_at_every_compressed_phase(digits):
    model = _model(digits)
    optimizer = HORST(model.parameters(), lr=1e-3)
    names = MaskSpec().select(model).names
    masked = MaskedStep(ErmStep("classification"), optimizer, names, sparsity=0.9,
                        schedule=ACDCSchedule(total_steps=60))  # fmt: skip
    result = _fit(model, optimizer, digits, steps=60, training_step=masked)
    assert result.warnings == []
    assert len(masked.phase_sparsities) >= 2
    assert all(value == pytest.approx(0.9, abs=0.01) for _, value in masked.phase_sparsities)


# --- once, also across a resume ---------------------------------------------------------------


def test_a_resumed_run_does_not_warn_again(digits, tmp_path):
    model = _model(digits)
    optimizer = HORST(model.parameters(), lr=1e-3, alpha=1.0)
    first = _fit(model, optimizer, digits, steps=20, run_dir=tmp_path, checkpoint_every=20)
    assert _checks(first) == {"mirror_acts"}
    model = _model(digits)
    optimizer = HORST(model.parameters(), lr=1e-3, alpha=1.0)
    resumed = _fit(model, optimizer, digits, steps=40, run_dir=tmp_path, resume=True)
    assert [record["step"] for record in resumed.warnings] == [first.warnings[0]["step"]]
    lines = (tmp_path / "metrics.jsonl").read_text().count('"split": "warning"')
    assert lines == 1


def test_checks_can_be_turned_off(digits):
    model = _model(digits)
    result = _fit(model, HORST(model.parameters(), lr=1e-3, alpha=1.0), digits, checks=False)
    assert result.warnings == [] and result.acting == []
    assert not any("mirror_move_ratio" in record for record in result.history)


def test_readings_cost_nothing_between_readings(digits):
    # every = max_steps / 20: 20 readings of the mirror ratio, none on the other steps
    model = _model(digits)
    result = _fit(model, HORST(model.parameters(), lr=1e-3), digits, steps=100)
    steps = [r["step"] for r in result.history if "mirror_move_ratio" in r]
    assert steps == list(range(5, 101, 5))
    assert all(math.isfinite(r["mirror_move_ratio"]) for r in result.history
               if "mirror_move_ratio" in r)  # fmt: skip
