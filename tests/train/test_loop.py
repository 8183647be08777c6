from __future__ import annotations

import json

import pytest
import torch

from convergent.train import FitConfig, evaluate, fit, read_metrics, warmup_schedule
from convergent.train.batches import iterate_batches
from tests.conftest import TinyClassifier, make_classification


def _train(run_dir, max_steps, resume=False, checkpoint_every=0, should_stop=None):
    torch.manual_seed(0)
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = warmup_schedule(optimizer, total_steps=12, warmup_steps=3, kind="cosine")
    torch.manual_seed(123)  # the dropout stream, which the checkpoint must carry
    result = fit(
        model,
        optimizer,
        make_classification(),
        max_steps=max_steps,
        batch_size=16,
        scheduler=scheduler,
        run_dir=run_dir,
        checkpoint_every=checkpoint_every,
        resume=resume,
        progress=False,
        tensorboard=False,
        seed=7,
        should_stop=should_stop,
    )
    return model, optimizer, result


def test_resume_continues_the_exact_trajectory(tmp_path):
    straight, straight_optimizer, _ = _train(tmp_path / "straight", 12)
    _train(tmp_path / "split", 6, checkpoint_every=6)
    resumed, resumed_optimizer, result = _train(tmp_path / "split", 12, resume=True)
    assert result.step == 12
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    state_a = straight_optimizer.state_dict()["state"]
    state_b = resumed_optimizer.state_dict()["state"]
    for key in state_a:
        assert torch.equal(state_a[key]["exp_avg_sq"], state_b[key]["exp_avg_sq"])


@pytest.mark.parametrize("asked", [0, 5])  # before the first step, and after the fifth
def test_a_stop_request_checkpoints_the_last_step_and_resume_finishes_the_same(tmp_path, asked):
    straight, _, _ = _train(tmp_path / "straight", 12)
    questions = []

    def should_stop() -> bool:
        questions.append(len(questions))
        return len(questions) > asked

    _, _, stopped = _train(tmp_path / "split", 12, checkpoint_every=4, should_stop=should_stop)
    assert stopped.stopped and stopped.step == asked
    assert stopped.checkpoint.name == f"step-{asked:08d}" and stopped.evaluation == {}
    resumed, _, result = _train(tmp_path / "split", 12, resume=True)
    assert result.step == 12 and not result.stopped
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_resume_without_checkpoint_differs_from_a_fresh_run(tmp_path):
    # Guard against a vacuous resume test: half a run is not the whole run.
    whole, _, _ = _train(tmp_path / "a", 12)
    half, _, _ = _train(tmp_path / "b", 6)
    assert not all(
        torch.equal(a, b) for a, b in zip(whole.parameters(), half.parameters(), strict=True)
    )


def test_training_learns_and_logs(tmp_path):
    data = make_classification(n=192)
    torch.manual_seed(0)
    model = TinyClassifier(dropout=0.0)
    before = evaluate(model, data, "classification")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    result = fit(
        model,
        optimizer,
        data,
        eval_data=data,
        eval_every=20,
        max_steps=60,
        batch_size=32,
        grad_clip=1.0,
        run_dir=tmp_path,
        progress=False,
    )
    assert result.evaluation["accuracy"] > max(0.8, before["accuracy"] + 0.2)
    records = read_metrics(tmp_path)
    assert {r["split"] for r in records} == {"train", "validation"}
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, 61))
    assert all("grad_norm" in r for r in records if r["split"] == "train")
    json.dumps(records)  # plain JSON all the way down
    assert any(p.name.startswith("events") for p in (tmp_path / "tensorboard").iterdir())


def test_bf16_autocast_runs_and_fp16_needs_cuda():
    data = make_classification()
    final = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = TinyClassifier(dropout=0.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        result = fit(model, optimizer, data, max_steps=3, batch_size=16, precision=precision,
                     progress=False, tensorboard=False)  # fmt: skip
        assert result.step == 3
        final[precision] = torch.cat([p.detach().flatten() for p in model.parameters()])
    # bf16 autocast really ran (the weights differ from fp32's) and stayed close to fp32
    # (bf16 keeps 8 bits of mantissa: relative error about 4e-3 per operation)
    assert not torch.equal(final["bf16"], final["fp32"])
    torch.testing.assert_close(final["bf16"], final["fp32"], rtol=0.05, atol=0.02)
    with pytest.raises(ValueError, match="fp16"):
        fit(model, optimizer, data, max_steps=1, batch_size=16, precision="fp16", progress=False)


def test_bad_arguments_name_the_value():
    data = make_classification(n=10)
    model = TinyClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"batch_size \(16\) must not exceed .* \(10\)"):
        fit(model, optimizer, data, max_steps=1, batch_size=16, progress=False)
    with pytest.raises(ValueError, match="precision must be one of"):
        fit(model, optimizer, data, max_steps=1, batch_size=4, precision="fp8", progress=False)
    with pytest.raises(ValueError, match="grad_clip"):
        fit(model, optimizer, data, max_steps=1, batch_size=4, grad_clip=0.0, progress=False)
    with pytest.raises(ValueError, match="max_steps must be a non-negative integer, got -1"):
        fit(model, optimizer, data, max_steps=-1, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="checkpoint_every > 0 needs a run_dir"):
        fit(model, optimizer, data, max_steps=1, batch_size=4, checkpoint_every=1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['max_step'\]"):
        fit(model, optimizer, data, max_step=1, batch_size=4)
    with pytest.raises(TypeError, match="not both"):
        fit(model, optimizer, data, FitConfig(max_steps=1, batch_size=4), progress=False)


def test_a_fit_config_trains_as_its_keywords_do():
    """``fit(..., FitConfig(**options))`` is ``fit(..., **options)``, step for step."""
    options = {"max_steps": 6, "batch_size": 16, "seed": 3, "progress": False}
    trained = []
    for config, keywords in ((None, options), (FitConfig(**options), {})):
        torch.manual_seed(0)
        model = TinyClassifier()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        result = fit(model, optimizer, make_classification(), config, **keywords)
        trained.append((model, result.train_loss))
    (first, first_loss), (second, second_loss) = trained
    assert first_loss == second_loss
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)


def test_non_finite_loss_names_the_step():
    data = make_classification()
    data.tensors["inputs"][3] = float("nan")
    model = TinyClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(FloatingPointError, match="at step 1"):
        fit(model, optimizer, data, max_steps=20, batch_size=96, progress=False)


def test_batches_split_one_global_batch_across_ranks():
    data = make_classification(n=40)
    whole = iterate_batches(data, 8, seed=3)
    halves = [iterate_batches(data, 8, seed=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(12):  # crosses an epoch boundary (5 batches per epoch)
        expected = next(whole)["inputs"]
        got = torch.cat([next(h)["inputs"] for h in halves])
        assert torch.equal(expected, got)


def test_batches_resume_mid_epoch():
    data = make_classification(n=40)
    stream = iterate_batches(data, 8, seed=1)
    skipped = [next(stream) for _ in range(7)]
    resumed = iterate_batches(data, 8, seed=1, start_step=7)
    assert torch.equal(next(stream)["labels"], next(resumed)["labels"])
    assert len(skipped) == 7


def test_schedule_errors_and_shape():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_schedule(optimizer, total_steps=10, warmup_steps=2, kind="linear")
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert rates[-1] == pytest.approx(0.125)
    with pytest.raises(ValueError, match="warmup_steps must be in"):
        warmup_schedule(optimizer, total_steps=10, warmup_steps=11)
    with pytest.raises(ValueError, match="schedule must be one of"):
        warmup_schedule(optimizer, total_steps=10, kind="step")
