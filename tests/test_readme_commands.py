"""The README's command list runs top to bottom in an empty folder, as a new user runs it.

The lines are read from the README itself and run in order, in-process, in a temporary
folder; a line fails the test when it exits non-zero, or when it reads a path that no earlier
line made. Whatever the list holds is run. To fit the default suite, the test cuts sizes and
rewrites what cannot run here; these are all the changes (``REWRITES`` lists them, and the
test prints each line it changed):

- ``convergent train``: ``--steps 2`` (a ``--resume`` line ``--steps 3``, past the run it
  continues); every validation and test split is cut to its first ``EXAMPLES`` examples;
- ``python examples/NAME.py``: ``--steps 2``;
- ``convergent prune ... --save``: ``--no-bench`` (the bench's timed processes are the
  ``convergent bench`` line's to run; in ``prune --save`` they took two thirds of this test);
- ``convergent bench``: ``--no-memory`` (its fresh process per variant, 20 of this test's 100 s,
  is tests/commands/test_compressed.py's to run);
- ``convergent reproduce``: ``--smoke`` in place of ``--quick``, ``--full`` or ``--mode``, and
  ``--seeds 1``;
- ``convergent report docs/results``: the checkout's ``docs/results``, and ``README.md`` is a
  copy of the README in the temporary folder.
"""

from __future__ import annotations

import runpy
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from convergent.cli import main
from convergent.data import is_cached

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
STEPS, RESUMED_STEPS, EXAMPLES = 2, 3, 32
REWRITES = (
    "train: --steps 2 (--resume: --steps 3); validation and test splits cut to 32 examples",
    "python examples/NAME.py: --steps 2",
    "prune --save: --no-bench (the bench line runs the bench)",
    "bench: --no-memory (tests/commands/test_compressed.py runs its memory processes)",
    "reproduce: --smoke instead of --quick/--full/--mode, --seeds 1",
    "report: the checkout's docs/results; README.md is a copy of the README",
)
# Flags whose value a line writes rather than reads (unless the line resumes that folder).
OUTPUT_FLAGS = ("--out", "--save")
SIZES = ("--quick", "--full", "--smoke")


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Each fenced block of a markdown text: (its language, its lines)."""
    blocks: list[tuple[str, list[str]]] = []
    language, lines = None, []
    for line in text.splitlines():
        if line.startswith("```") and language is None:
            language, lines = line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append((language, lines))
            language = None
        elif language is not None:
            lines.append(line)
    return blocks


def readme_commands() -> list[str]:
    """The lines of the README's command block: the plain block that runs ``convergent``."""
    (block,) = [
        lines
        for language, lines in code_blocks(README.read_text())
        if not language and any(line.startswith("convergent train ") for line in lines)
    ]
    return [line for line in block if line.strip()]


def _set(words: list[str], flag: str, value: str) -> list[str]:
    """``words`` with ``flag``'s value replaced, or the flag and value appended."""
    if flag in words:
        index = words.index(flag)
        return [*words[: index + 1], value, *words[index + 2 :]]
    return [*words, flag, value]


def rewrite(words: list[str]) -> list[str]:
    """The words of a README line as this test runs them (see the module's docstring)."""
    if words[:2] == ["convergent", "train"]:
        return _set(words, "--steps", str(RESUMED_STEPS if "--resume" in words else STEPS))
    if words[0] == "python" and words[1].startswith("examples/"):
        return _set(words, "--steps", str(STEPS))
    if words[:2] == ["convergent", "prune"] and "--save" in words and "--no-bench" not in words:
        return [*words, "--no-bench"]
    if words[:2] == ["convergent", "bench"] and "--no-memory" not in words:
        return [*words, "--no-memory"]
    if words[:2] == ["convergent", "reproduce"]:
        kept, skip = [], False
        for word in words:
            if skip:
                skip = False
            elif word == "--mode":
                skip = True
            elif word not in SIZES:
                kept.append(word)
        return _set([*kept, "--smoke"], "--seeds", "1")
    if words[:2] == ["convergent", "report"]:
        return [str(ROOT / word) if word.startswith("docs/results") else word for word in words]
    return words


def read_paths(words: list[str]) -> list[str]:
    """The relative paths a line reads: every path word but an output flag's value (a
    resumed run's folder is read) and a script of the checkout."""
    paths = []
    for index, word in enumerate(words):
        if word.startswith("-") or "/" not in word or Path(word).is_absolute():
            continue
        if index and words[index - 1] in OUTPUT_FLAGS and "--resume" not in words:
            continue
        if words[0] == "python" and index == 1:
            continue
        paths.append(word)
    return paths


def _cut_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' ``load_splits`` returns validation and test splits of ``EXAMPLES``
    (the commands are imported first, so that the patch reaches each one and is undone after
    the test)."""
    import dataclasses

    import convergent.commands
    import convergent.data
    from convergent.data import DictDataset

    load = convergent.data.load_splits

    def cut(*args, **kwargs):
        splits = load(*args, **kwargs)
        short = {
            name: DictDataset({key: value[:EXAMPLES] for key, value in split.tensors.items()})
            for name, split in (("validation", splits.validation), ("test", splits.test))
        }
        return dataclasses.replace(splits, **short)

    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("convergent.commands") and getattr(module, "load_splits", None) is load:
            monkeypatch.setattr(module, "load_splits", cut)
            patched.append(name)
    assert "convergent.commands.train" in patched, patched


def _runner(words: list[str], monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    if words[0] == "convergent":
        return lambda: main(words[1:])
    if words[0] == "python" and words[1].startswith("examples/"):

        def script() -> int:
            monkeypatch.setattr(sys, "argv", [words[1], *words[2:]])
            runpy.run_path(str(ROOT / words[1]), run_name="__main__")
            return 0

        return script
    raise AssertionError(f"the test has no way to run this README line: {shlex.join(words)}")


def _needs_fashion_mnist() -> None:
    if shutil.which("apt-get") is None and not is_cached("fashion-mnist"):
        pytest.skip("the README's fashion-mnist needs apt-get (Debian or Ubuntu) or a cached copy")


def test_every_train_line_writes_its_own_folder():
    outs = []
    for line in readme_commands():
        words = shlex.split(line, comments=True)
        if words[:2] == ["convergent", "train"]:
            assert "--out" in words, f"README line without --out: {line}"
            if "--resume" not in words:
                outs.append(words[words.index("--out") + 1])
    assert len(outs) == len(set(outs)), f"two train lines write one folder: {outs}"


def test_the_readme_commands_run_top_to_bottom(tmp_path, monkeypatch, capsys):
    lines = readme_commands()
    _needs_fashion_mnist()
    monkeypatch.chdir(tmp_path)
    shutil.copy(README, tmp_path / "README.md")
    _cut_splits(monkeypatch)
    for number, line in enumerate(lines, start=1):
        words = shlex.split(line, comments=True)
        run = rewrite(words)
        if run != words:
            print(f"line {number} runs as: {shlex.join(run)}")
        for path in read_paths(run):
            assert Path(path).exists(), (
                f"README command {number} ({line}) reads {path}, which no earlier line made"
            )
        started, cpu = time.perf_counter(), time.process_time()
        status = _runner(run, monkeypatch)()
        print(
            f"line {number}: {time.perf_counter() - started:.1f} s"
            f" ({time.process_time() - cpu:.1f} s of CPU)"
        )
        assert status == 0, (
            f"README command {number} failed ({status}): {line}\n"
            + (capsys.readouterr().err[-2000:])
        )


def test_rewrites_cut_sizes_only():
    assert rewrite(shlex.split("convergent train --data digits --steps 500 --out runs/d")) == [
        *("convergent", "train", "--data", "digits", "--steps", "2", "--out", "runs/d")
    ]
    resumed = rewrite(shlex.split("convergent train --out runs/d --resume"))
    assert resumed[-2:] == ["--steps", "3"]
    study = rewrite(shlex.split("convergent reproduce sparsity --full --seeds 8 --out x/y"))
    assert shlex.join(study) == "convergent reproduce sparsity --seeds 1 --out x/y --smoke"
    assert read_paths(shlex.split("convergent prune runs/a --save runs/b")) == ["runs/a"]
    assert read_paths(shlex.split("convergent train --out runs/a --resume")) == ["runs/a"]


PARSED = [
    path for path in sorted((ROOT / "examples").glob("*.py")) if "argparse" in path.read_text()
]


@pytest.mark.parametrize("script", PARSED, ids=lambda path: path.name)
def test_every_example_with_options_prints_its_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [script.name, "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    assert exited.value.code == 0 and "usage:" in capsys.readouterr().out
