"""Fault injection on `convergent train` run folders: a process killed at any point resumes to
the same weights, bit for bit; a second run never damages the first; every refusal is one line.

A killed run is a child process that SIGKILLs itself at a chosen point: after an optimizer step,
or in the middle of writing a checkpoint (before the weights, half-way through the weights file,
before the state file, before ``latest`` moves). The points are drawn once from a seeded
generator, so the suite is the same on every run.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from convergent.cli import main

STEPS = 8
TRAIN = [
    "train",
    "--data",
    "digits",
    "--model",
    "transformer",
    "--steps",
    str(STEPS),
    "--batch-size",
    "16",
    "--lr",
    "0.003",
    "--d-model",
    "16",
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--d-ff",
    "32",
    "--eval-every",
    "0",
    "--checkpoint-every",
    "1",
    "--no-progress",
]

# A killed run's child plants a SIGKILL at one point (``point``, ``step``), then runs the CLI.
KILL = r"""
import os, signal
from convergent.train import checkpoint, loop

name = f"step-{step:08d}"

def die():
    os.kill(os.getpid(), signal.SIGKILL)

real_save_model, real_torch_save = checkpoint.save_model, checkpoint.torch.save
real_write_text = checkpoint.write_text_atomically

def save_model(model, path, *args, **kwargs):
    if name in path and point == "before-weights":
        die()
    if name in path and point == "torn-weights":
        real_save_model(model, path, *args, **kwargs)
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 2)
        die()
    return real_save_model(model, path, *args, **kwargs)

def torch_save(obj, target, *args, **kwargs):
    if name in str(target) and point == "before-state":
        die()
    return real_torch_save(obj, target, *args, **kwargs)

def write_text(path, text):
    if path.name == "latest" and text.strip() == name and point == "before-latest":
        die()
    return real_write_text(path, text)

checkpoint.save_model = save_model
checkpoint.torch.save = torch_save
checkpoint.write_text_atomically = write_text
real_log = loop.MetricsLogger.log

def log(self, at, split, values):
    real_log(self, at, split, values)
    if point == "after-step" and at == step and split == "train":
        die()

loop.MetricsLogger.log = log
"""

# The children are forked, one per run, from one fresh interpreter (not this test process)
# that imported torch and the train command once: a child is a process of its own, killed or
# signalled as a `convergent train` process is, without the 3 s of CPU a new interpreter
# spends importing. Each request (a JSON line) names the patches to plant, their values, the
# command line and two files for the child's stdout and stderr; the launcher answers with the
# child's exit status as subprocess reports it (-9: SIGKILL ended it).
LAUNCHER = r"""
import json, os, sys, traceback
import torch
torch.set_num_threads(1)  # as in this test process: the same reduction order, bit for bit
import matplotlib.figure, safetensors.torch, torch._dynamo, torch.utils.tensorboard
from convergent.cli import build_parser, main
build_parser("train")  # the train command's imports
for line in iter(sys.stdin.readline, ""):
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            exec(request["plant"], dict(request["values"]))
            status = main(request["argv"])
        except SystemExit as error:
            status = error.code if isinstance(error.code, int) else int(error.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """``launch(plant, values, argv)``: a child's (exit status, stdout, stderr)."""
    folder = tmp_path_factory.mktemp("launcher")
    with (folder / "launcher.err").open("w") as errors:
        launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    children = itertools.count()

    def run(plant: str, values: dict, argv: list[str]) -> tuple[int, str, str]:
        index = next(children)
        out, err = folder / f"{index}.out", folder / f"{index}.err"
        request = {"plant": plant, "values": values, "argv": argv}
        launcher.stdin.write(json.dumps({**request, "stdout": str(out), "stderr": str(err)}))
        launcher.stdin.write("\n")
        launcher.stdin.flush()
        answered, _, _ = select.select([launcher.stdout], [], [], 300)
        line = launcher.stdout.readline() if answered else ""
        assert line, f"the launcher did not answer: {(folder / 'launcher.err').read_text()}"
        return int(line), out.read_text(), err.read_text()

    yield run
    launcher.stdin.close()
    assert launcher.wait(timeout=60) == 0, (folder / "launcher.err").read_text()


POINTS = ("after-step", "before-weights", "torn-weights", "before-state", "before-latest")


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step-{STEPS:08d}"
    return load_file(run / "checkpoints" / latest / "model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, torch.Tensor]:
    run = tmp_path_factory.mktemp("reference") / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    return _final_weights(run)


def _kill_points() -> list[tuple[str, int]]:
    steps = random.Random(20261201).sample(range(2, STEPS), len(POINTS))  # distinct steps
    return list(zip(POINTS, steps, strict=True))


@pytest.mark.parametrize(("point", "step"), _kill_points())
def test_a_killed_run_resumes_to_the_same_weights(point, step, tmp_path, reference, launch, capsys):
    run = tmp_path / "run"
    values = {"point": point, "step": step}
    status, _, stderr = launch(KILL, values, [*TRAIN, "--out", str(run)])
    assert status == -signal.SIGKILL, stderr[-2000:]
    assert not (run / "summary.json").exists()
    # Resuming needs no training flag repeated: the run's own config.json is read.
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    resumed = _final_weights(run)
    assert resumed.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(resumed[name], tensor), name
    steps = [row["step"] for row in map(json.loads, (run / "metrics.jsonl").open())
             if row["split"] == "train"]  # fmt: skip
    assert steps == list(range(1, STEPS + 1)), "each step logged once after the resume"


# The child sends itself a signal once a chosen step is logged, as a Ctrl-C (SIGINT) or a
# scheduler's kill (SIGTERM) would arrive in the middle of training.
SIGNALLED = r"""
import os, signal
from convergent.train import loop

real_log = loop.MetricsLogger.log

def log(self, at, split, values):
    real_log(self, at, split, values)
    if at == step and split == "train":
        os.kill(os.getpid(), getattr(signal, name))

loop.MetricsLogger.log = log
"""


@pytest.mark.parametrize(("name", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_stops_the_run_with_a_checkpoint_that_resumes_to_the_same_weights(
    name, status, tmp_path, reference, launch
):
    run, step = tmp_path / "run", 3
    # Checkpoints every 5 steps: the one at step 3 is written because of the signal.
    argv = [*TRAIN, "--checkpoint-every", "5", "--out", str(run)]
    code, _, stderr = launch(SIGNALLED, {"name": name, "step": step}, argv)
    assert code == status, stderr[-2000:]
    assert f"stopped by {name} at step {step} of {STEPS}" in stderr
    assert f"continue with: convergent train --out {run} --resume" in stderr
    assert "Traceback" not in stderr and not (run / "summary.json").exists()
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step-{step:08d}"
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    resumed = _final_weights(run)
    for tensor_name, tensor in reference.items():
        assert torch.equal(resumed[tensor_name], tensor), tensor_name


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def test_a_second_run_into_the_same_folder_is_refused_and_changes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--steps", "3", "--out", str(run)]) == 0
    before = _tree(run)
    capsys.readouterr()
    assert main([*TRAIN, "--steps", "2", "--out", str(run)]) == 2
    assert "already holds a run; pass --resume" in _one_line_error(capsys)
    assert _tree(run) == before
    # --overwrite starts again: one run's metrics, its own checkpoints, latest among them.
    assert main([*TRAIN, "--steps", "2", "--out", str(run), "--overwrite"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [row["step"] for row in rows if row["split"] == "train"] == [1, 2]
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step-00000002" and (run / "checkpoints" / latest).is_dir()


def test_resume_refuses_conflicts_and_an_empty_folder_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--steps", "3", "--out", str(run)]) == 0
    before = _tree(run)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--lr", "0.1"]) == 2
    assert "--lr 0.1 conflicts with the run's own lr (0.003)" in _one_line_error(capsys)
    assert main(["train", "--out", str(run), "--resume", "--d-model", "32"]) == 2
    assert "--d-model 32 conflicts" in _one_line_error(capsys)
    assert main(["train", "--out", str(run), "--resume", "--steps", "2"]) == 2
    assert "--steps 2 is below the step of the run's checkpoint (3)" in _one_line_error(capsys)
    assert _tree(run) == before
    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "nothing to resume in" in _one_line_error(capsys)
    # The run's own config.json (notes included) is a config file resume accepts.
    own = ["train", "--config", str(run / "config.json"), "--out", str(run), "--resume"]
    assert main([*own, "--no-progress"]) == 0
    # Extending a run is allowed: only the new steps are trained.
    assert main(["train", "--out", str(run), "--resume", "--steps", "5", "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["steps"] == 5
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [row["step"] for row in rows if row["split"] == "train"] == [1, 2, 3, 4, 5]


def test_a_folder_without_a_checkpoint_cannot_be_resumed(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--steps", "2", "--out", str(run)]) == 0
    for folder in (run / "checkpoints").iterdir():
        if folder.is_dir():
            for file in folder.iterdir():
                file.unlink()
            folder.rmdir()
    (run / "checkpoints" / "latest").unlink()
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume"]) == 2
    assert "has no checkpoint to resume from; pass --overwrite" in _one_line_error(capsys)


def test_a_file_as_the_run_folder_is_one_line(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert main([*TRAIN, "--out", str(target)]) == 2
    assert f"the run folder {target} is a file" in _one_line_error(capsys)
    assert target.read_text() == "mine"


def test_a_diverged_run_stops_in_one_line_and_keeps_its_last_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--lr", "1e30", "--grad-clip", "0", "--out", str(run)]) == 2
    err = _one_line_error(capsys)
    assert "training diverged: the loss became" in err and "lower the learning rate" in err
    step = int(err.split(" at step ")[1].split(";")[0])
    assert step >= 2, "the first steps were finite, so there is a checkpoint to keep"
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step-{step - 1:08d}"
    assert load_file(run / "checkpoints" / latest / "model.safetensors")


def test_cuda_on_a_machine_without_it_is_one_line(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main([*TRAIN, "--device", "cuda", "--out", str(tmp_path / "run")]) == 2
    assert "device 'cuda' was asked for, but this PyTorch build sees no CUDA" in _one_line_error(
        capsys
    )


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # flip one bit in the middle of the file
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "flip"])
@pytest.mark.parametrize("file", ["model.safetensors", "state.pt", "manifest.json"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(
    file, how, tmp_path, reference, capsys, caplog
):
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    newest = run / "checkpoints" / f"step-{STEPS:08d}"
    _damage(newest / file, how)
    caplog.clear()
    # The damaged checkpoint is named in one warning line; training resumes from the one
    # before it and ends where an undamaged run ends, bit for bit.
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and newest.name in warnings[0] and "\n" not in warnings[0]
    resumed = _final_weights(run)
    for name, tensor in reference.items():
        assert torch.equal(resumed[name], tensor), name
