from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from convergent.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--data", "nosuch"], "Unknown data source 'nosuch'"),
        (
            ["train", "--data", "digits", "--steps", "-3"],
            "steps must be a positive integer, got -3",
        ),
        (["train", "--data", "digits", "--lr", "0"], "lr must be positive, got 0.0"),
        (
            ["train", "--data", "digits", "--model", "gpt9"],
            "model must be one of transformer, minilm",
        ),
        (["train", "--data", "digits", "--model", "minilm"], "needs text data"),
        (
            ["train", "--config", "/no/such/config.json"],
            "config file /no/such/config.json does not exist",
        ),
        (["data", "fetch", "nosuch"], "Unknown data source 'nosuch'"),
        (["diagnose", "/no/such/run", "--data", "digits"], "/no/such/run: the path does not exist"),
        (["prune", "/no/such/run"], "no run or checkpoint at /no/such/run"),
        (
            ["reproduce", "residual", "--pilot"],
            "--pilot runs one study that has a pilot (descent or sparsity), got residual",
        ),
    ],
)
def test_user_errors_are_one_sentence_without_traceback(argv, message, capsys, tmp_path):
    status = main([*argv, *(["--out", str(tmp_path)] if argv[0] == "train" else [])])
    captured = capsys.readouterr()
    assert status == 2
    assert message in captured.err
    assert "Traceback" not in captured.err
    assert captured.err.count("\n") == 1


def test_unknown_config_key_is_named(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"steps": 3, "learning_rate": 0.1}))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    assert "unknown config key(s) ['learning_rate']" in capsys.readouterr().err


def test_train_writes_a_run_folder(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"data": "digits", "model": "transformer", "steps": 4, "d_model": 16})
    )
    run = tmp_path / "run"
    argv = ["train", "--config", str(config), "--batch-size", "32", "--lr", "0.003"]
    status = main([*argv, "--out", str(run), "--eval-every", "2", "--no-progress", "--test"])
    assert status == 0
    assert "test accuracy" in capsys.readouterr().out
    for name in (
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "loss_curve.png",
        "checkpoints/latest",
    ):
        assert (run / name).exists(), name
    saved = json.loads((run / "config.json").read_text())
    assert saved["batch_size"] == 32 and saved["d_model"] == 16 and saved["steps"] == 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4
    # the summary's test accuracy is the saved model's, recomputed here by hand
    from convergent.commands import TrainConfig, build_model
    from convergent.data import load_splits
    from convergent.train import load_checkpoint

    config_back = TrainConfig.from_dict(saved)
    splits = load_splits("digits", seed=config_back.seed)
    model = build_model(config_back, splits)
    load_checkpoint(run / "checkpoints", model)
    model.eval()
    test = splits.test.tensors
    with torch.no_grad():
        predicted = model(inputs=test["inputs"]).logits.argmax(dim=-1)
    accuracy = float((predicted == test["labels"]).float().mean())
    assert summary["test"]["accuracy"] == pytest.approx(accuracy, abs=0.5 / len(predicted))
    assert (run / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_prune_reports_each_sparsity(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [
        "train",
        "--data",
        "digits",
        "--model",
        "transformer",
        "--steps",
        "3",
        "--d-model",
        "16",
    ]
    assert main([*argv, "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["prune", str(run), "--sparsity", "0.5", "--sparsity", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "\n| 0.5000 | " in out and "\n| 0.8000 | " in out
    assert main(["prune", str(run), "--sparsity", "1.5"]) == 2
    assert "sparsity must be in [0, 1), got 1.5" in capsys.readouterr().err
    assert main(["prune", str(run), "--sparsity", "1.0"]) == 2
    assert "got 1.0 (1 would prune every weight)" in capsys.readouterr().err


def test_reproduce_runs_studies_writes_reports_and_an_index(monkeypatch, capsys, tmp_path):
    from convergent import studies

    monkeypatch.setitem(studies.STUDIES, "toy", "tests.studies.toy_study")
    monkeypatch.setitem(studies.STUDIES, "toy2", "tests.studies.toy_study")
    assert main(["reproduce", "toy", "toy2", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"toy (quick): running, report into {tmp_path / 'toy'}" in out
    # one line per claim: verdict (a preview with one seed), effect, interval, n, checks
    assert (
        "  [reproduced (preview)] one plus one is two (here: at least 1.5): effect 2.1 (a sum)"
        " (95 % interval none (1 seed), n=1; holds if >= 1.5); checks: the adder ran = 1"
        " (need >= 1) ok" in out
    )
    assert "one plus one is two" in (tmp_path / "toy" / "report.md").read_text()
    payload = json.loads((tmp_path / "toy2" / "results.json").read_text())
    assert payload["mode"] == "quick"
    claim = payload["claims"][0]
    assert claim["verdict"] == "reproduced" and claim["preview"] is True and claim["n"] == 1
    assert claim["interval"] is None and claim["effect"] == pytest.approx(2.1)
    assert claim["checks"] == [
        {"name": "the adder ran", "value": 1.0, "required": ">= 1", "passed": True, "note": ""}
    ]
    assert "[toy](toy/report.md)" in (tmp_path / "README.md").read_text()


def test_reproduce_seeds_overrides_the_mode_and_resumes_from_finished_units(
    monkeypatch, capsys, tmp_path
):
    from scipy import stats

    from convergent import studies
    from tests.studies import toy_study

    monkeypatch.setitem(studies.STUDIES, "toy", "tests.studies.toy_study")
    monkeypatch.setattr(toy_study, "COMPUTED", [])
    assert main(["reproduce", "toy", "--quick", "--seeds", "3", "--out", str(tmp_path)]) == 0
    assert toy_study.COMPUTED == [0, 1, 2]
    claim = json.loads((tmp_path / "toy" / "results.json").read_text())["claims"][0]
    sums = [2.1, 1.8, 2.05]
    low, high = stats.t.interval(0.95, 2, loc=sum(sums) / 3, scale=stats.sem(sums))
    assert claim["n"] == 3 and claim["preview"] is False
    assert claim["interval"] == pytest.approx([low, high])
    assert claim["verdict"] == ("reproduced" if low >= 1.5 else "inconclusive")
    # a fourth seed reuses the three finished units and computes one
    assert main(["reproduce", "toy", "--quick", "--seeds", "4", "--out", str(tmp_path)]) == 0
    assert toy_study.COMPUTED == [0, 1, 2, 3]
    assert "n=4" in capsys.readouterr().out
    assert main(["reproduce", "toy", "--smoke", "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert "--seeds must be a positive integer, got 0" in capsys.readouterr().err


def test_report_writes_and_checks_a_readme_results_section(monkeypatch, capsys, tmp_path):
    from convergent import studies
    from convergent.studies.framework.readme import END, START

    monkeypatch.setitem(studies.STUDIES, "toy", "tests.studies.toy_study")
    results = tmp_path / "docs" / "results"
    assert main(["reproduce", "toy", "--full", "--out", str(results)]) == 0
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{START}\nold text\n{END}\n\nafter\n")
    capsys.readouterr()
    assert main(["report", str(results), "--readme", str(readme), "--check"]) == 1
    assert "out of date" in capsys.readouterr().out
    assert main(["report", str(results), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"# title\n\n{START}\n") and text.endswith(f"{END}\n\nafter\n")
    assert "old text" not in text
    assert "| `toy.one_plus_one_is_two` | reproduced | 1.983 [1.584, 2.383] | (a sum) | 3 |" in text
    assert "[`docs/results/toy/`](docs/results/toy/report.md)" in text
    assert main(["report", str(results), "--readme", str(readme), "--check"]) == 0
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder of study reports" in capsys.readouterr().err


def test_reproduce_refuses_an_unknown_study(capsys):
    assert main(["reproduce", "nosuch", "--smoke"]) == 2
    assert "unknown study 'nosuch'; the studies are: descent, langevin, residual" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("optimizer", ["horst", "ham"])
def test_train_with_the_sparsity_optimizers(optimizer, tmp_path, capsys):
    argv = ["train", "--data", "digits", "--model", "transformer", "--steps", "3",
            "--d-model", "16", "--optimizer", optimizer, "--no-progress"]  # fmt: skip
    assert main([*argv, f"--{optimizer}-alpha", "2.0", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["optimizer"] == optimizer and saved[f"{optimizer}_alpha"] == 2.0
    assert main([*argv, f"--{optimizer}-beta", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert f"--{optimizer}-beta must be non-negative, got -1.0" in capsys.readouterr().err


def test_small_command_line_promises(tmp_path, capsys):
    from convergent.cli import build_parser

    # reproduce defaults to the quick mode (full takes hours).
    assert build_parser().parse_args(["reproduce", "residual"]).mode == "quick"
    # --help names the values --data, --model and --optimizer accept.
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--data STR one of rt-sentences, digits, weather-hourly" in text
    assert "--model STR one of transformer, minilm" in text
    assert "--optimizer STR one of adamw, sgd, horst, ham" in text
    # python -m convergent is the same command.
    module = subprocess.run(
        [sys.executable, "-m", "convergent", "--version"], capture_output=True, text=True
    )
    assert module.returncode == 0 and module.stdout.startswith("convergent ")


def test_a_pruned_run_saved_by_prune_is_a_run_folder_diagnose_and_prune_accept(tmp_path, capsys):
    run, pruned = tmp_path / "run", tmp_path / "pruned"
    argv = ["train", "--data", "digits", "--model", "transformer", "--steps", "3"]
    assert main([*argv, "--d-model", "16", "--out", str(run), "--no-progress"]) == 0
    assert main(["prune", str(run), "--sparsity", "0.5", "--save", str(pruned), "--no-bench"]) == 0
    assert (pruned / "config.json").read_text() == (run / "config.json").read_text()
    assert main(["diagnose", str(pruned), "--data", "digits", "--out", str(tmp_path / "d")]) == 0
    capsys.readouterr()
    assert main(["prune", str(pruned), "--sparsity", "0.6"]) == 0
    assert "| 0.6000 |" in capsys.readouterr().out
    # A second save into the same folder would replace a run: refused in one line, before
    # pruning, naming prune's own flag (prune has no --overwrite to suggest).
    assert main(["prune", str(run), "--sparsity", "0.5", "--save", str(pruned)]) == 2
    err = capsys.readouterr().err
    assert f"the --save folder {pruned} already holds a run; name a new folder" in err
    assert "--overwrite" not in err


def test_seeds_skip_a_studys_selection_seed():
    from convergent.studies import study_config

    # The sparsity and descent studies tune with seed 0: --seeds 3 gives three other seeds.
    for name in ("sparsity", "descent"):
        config = study_config(name, "smoke", seeds=3)
        assert config.selection_seed == 0 and config.seeds == (1, 2, 3)
    assert study_config("residual", "smoke", seeds=2).seeds == (0, 1)


def test_seeds_extend_the_modes_own_seeds_so_a_larger_run_reuses_the_committed_units():
    from convergent.studies import study_config

    # full mode's final seeds are 21-25 (selection 20): 8 seeds keep them and add 26-28
    assert study_config("descent", "full", seeds=8).seeds == (21, 22, 23, 24, 25, 26, 27, 28)
    assert study_config("sparsity", "full", seeds=3).seeds == (21, 22, 23)
    assert study_config("langevin", "full", seeds=6).seeds == (20, 21, 22, 23, 24, 25)
    assert study_config("residual", "full", seeds=5).seeds == (10, 11, 12, 13, 14)
    # descent's pilots read seeds 30-32 to choose the design: 12 seeds skip them
    assert study_config("descent", "full", seeds=12).seeds == (*range(21, 30), 33, 34, 35)


def test_seeds_continue_past_the_seeds_a_study_tunes_with(monkeypatch):
    import dataclasses
    import types

    from convergent import studies

    @dataclasses.dataclass(frozen=True)
    class Config:
        seeds: tuple[int, ...] = (5, 6)

    study = types.SimpleNamespace(config=lambda mode: Config(), reserved_seeds=lambda _: {7, 9})
    monkeypatch.setattr(studies, "get_study", lambda name: study)
    assert studies.study_config("any", "full", seeds=1).seeds == (5,)
    # 7 and 9 tune the study: a final run never shares them
    assert studies.study_config("any", "full", seeds=5).seeds == (5, 6, 8, 10, 11)


def test_prune_help_quotes_the_defaults_of_the_prune_request(monkeypatch, capsys):
    import dataclasses

    from convergent.cli import build_parser
    from convergent.commands.prune_request import PruneRequest

    fields = {field.name: field for field in dataclasses.fields(PruneRequest)}
    monkeypatch.setattr(fields["max_length"], "default", 77)
    monkeypatch.setattr(fields["seed"], "default", 5)
    monkeypatch.setattr(fields["calibration_examples"], "default", 33)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["prune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "tokens per example (default 77)" in text and "and test (default 5)" in text
    assert "calibrate on (default 33)" in text


def test_train_with_langevin_a_villani_regularizer_and_its_checks(tmp_path, capsys):
    argv = ["train", "--data", "digits", "--model", "transformer", "--steps", "40", "--lr", "0.05",
            "--d-model", "16", "--optimizer", "langevin", "--langevin-temperature", "0.01",
            "--villani-target", "query_key", "--villani-lam", "1e-3", "--no-progress"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["warnings"] == []
    assert any(line.startswith("Langevin acts:") for line in summary["acting"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert any("penalty" in record for record in records)  # the regularizer's term is logged
    # s = 1e-12 in the same run: one warning line, in the summary too
    cold = [*argv[:-1], "--no-progress", "--out", str(tmp_path / "cold")]
    cold[cold.index("--langevin-temperature")] = "--langevin-s"
    cold[cold.index("0.01")] = "1e-12"
    assert main(cold) == 0
    summary = json.loads((tmp_path / "cold" / "summary.json").read_text())
    assert [warning["check"] for warning in summary["warnings"]] == ["noise_acts"]
    assert "raise the temperature" in summary["warnings"][0]["message"]
    capsys.readouterr()
    bad = ["train", "--data", "digits", "--optimizer", "langevin", "--out", str(tmp_path / "x")]
    assert main(bad) == 2
    assert "--optimizer langevin needs exactly one of --langevin-s" in capsys.readouterr().err


def test_train_defaults_fit_the_model_kind_and_are_noted(tmp_path, capsys):
    from convergent.commands import TrainConfig

    # A pretrained model fine-tunes at MiniLM's usual rate; ours trains from scratch at the
    # rate measured on the README's runs (benchmarks/train_learning_rate.py).
    assert TrainConfig(model="minilm").lr == 5e-5
    assert TrainConfig(data="digits", model="transformer").lr == 1e-3
    assert TrainConfig(model="transformer", lr=3e-4).lr == 3e-4
    # A checkpoint about every tenth of the run, every step in a short one; 0 keeps "at the end".
    assert [TrainConfig(steps=n).checkpoint_every for n in (250, 25, 7)] == [25, 3, 1]
    assert TrainConfig(checkpoint_every=0).checkpoint_every == 0
    run = tmp_path / "run"
    argv = ["train", "--data", "digits", "--model", "transformer", "--steps", "20"]
    assert main([*argv, "--d-model", "16", "--no-progress", "--out", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "validation accuracy" in printed and "test accuracy" not in printed
    saved = json.loads((run / "config.json").read_text())
    assert saved["lr"] == 1e-3 and saved["checkpoint_every"] == 2
    assert saved["notes"][0].startswith("lr 0.001: the default for training a transformer")
    assert sorted(path.name for path in (run / "checkpoints").glob("step-*")) == [
        "step-00000018",
        "step-00000020",
    ]
    assert "test" not in json.loads((run / "summary.json").read_text())


def test_a_process_torchrun_launched_ends_with_its_status_and_its_output_flushed():
    # Under torchrun the command line ends with os._exit (cli.main says why): what it printed
    # must still arrive, and its exit status be the command's own.
    environment = {**os.environ, "TORCHELASTIC_RUN_ID": "test"}
    code = "import sys; from convergent.cli import main; main(); print('not reached')"
    done = subprocess.run(
        [sys.executable, "-c", code, "data", "list"],
        env=environment,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "rt-sentences" in done.stdout
    assert "not reached" not in done.stdout
