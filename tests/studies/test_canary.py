"""The numbers' fingerprint: the same in every process, kept by a refactor, moved by a number.

The refactor and the changed constant are made for real, on copies of the package that two
fresh processes, on different thread counts, import module by module anew.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from convergent.optim import horst
from convergent.studies.framework import canary

PACKAGE = Path(canary.__file__).resolve().parents[2]  # src/convergent
# With torch on ``argv[1]`` threads, imports each package root of ``argv[2:]`` in turn (its
# modules only: torch is imported once, which keeps these tests near 10 s) and prints where
# its HORST came from, its fingerprint and its canary's hash on this process's own kernels.
PROBE = """
import importlib, sys, torch
torch.set_num_threads(int(sys.argv[1]))
for root in sys.argv[2:]:
    for name in [n for n in sys.modules if n.split(".")[0] == "convergent"]:
        del sys.modules[name]
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    from convergent.optim import horst
    from convergent.studies.framework.canary import fingerprint_here, numerics_fingerprint
    print(horst.__file__, numerics_fingerprint(), fingerprint_here())
    sys.path.remove(root)
"""


def _copy(root: Path) -> Path:
    """A copy of the package under ``root/src``; returns the copy's ``convergent`` folder."""
    target = root / "src" / "convergent"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _refactor(package: Path) -> None:
    """A comment, a private method and a private function renamed everywhere: no number can
    move."""
    source = package / "optim" / "horst.py"
    text = source.read_text()
    source.write_text(text.replace("\nclass HORST(", "\n# A comment.\nclass HORST(", 1))
    renames = {
        "optim/horst.py": ("_update_group", "_step_one_group"),
        "optim/factory.py": ("_check_name", "_optimizer_class"),
    }
    for file, (old, new) in renames.items():
        assert re.search(rf"\b{old}\b", (package / file).read_text()), f"{old} left {file}"
        for path in package.rglob("*.py"):
            content = path.read_text()
            renamed = re.sub(rf"\b{old}\b", new, content)
            if renamed != content:
                path.write_text(renamed)


def _change_a_constant(package: Path) -> None:
    """HORST's default second-moment decay 0.999 -> 0.99: every HORST step moves."""
    source = package / "optim" / "horst.py"
    text = source.read_text()
    old = "betas: tuple[float, float] = (0.9, 0.999),"
    assert text.count(old) == 1, "HORST's betas default moved: pick another constant"
    source.write_text(text.replace(old, "betas: tuple[float, float] = (0.9, 0.99),"))


def _same(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Equal to the bit (NaN included), as the fingerprint compares."""
    return first.dtype == second.dtype and first.numpy().tobytes() == second.numpy().tobytes()


@pytest.fixture(scope="module")
def fingerprints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Fingerprints from two fresh processes run side by side: one on one thread computes the
    package's, then a refactored copy's; one on two threads computes a copy's with a changed
    constant, then the package's."""
    root = tmp_path_factory.mktemp("copies")
    refactored, changed = _copy(root / "refactored"), _copy(root / "changed")
    _refactor(refactored)
    _change_a_constant(changed)
    plans = {
        1: [("package", PACKAGE), ("refactored", refactored)],
        2: [("changed", changed), ("package, two threads", PACKAGE)],
    }
    processes = {
        threads: subprocess.Popen(
            [sys.executable, "-c", PROBE, str(threads), *[str(p.parent) for _, p in plan]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for threads, plan in plans.items()
    }
    results = {}
    for threads, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        lines = stdout.split("\n")[: len(plans[threads])]
        for (name, package), line in zip(plans[threads], lines, strict=True):
            location, fingerprint, here = line.split()
            assert Path(location).is_relative_to(package)  # this package's code ran
            results[name], results[f"{name} here"] = fingerprint, here
    return results


def test_the_fingerprint_is_the_same_in_fresh_processes_whatever_their_threads(fingerprints):
    assert re.fullmatch("[0-9a-f]{16}", fingerprints["package"])
    assert fingerprints["package, two threads"] == fingerprints["package"]
    # the canary itself runs on one thread whatever the caller's count (the fingerprint's
    # interpreter runs on one anyway)
    assert fingerprints["package, two threads here"] == fingerprints["package here"]


def test_a_comment_and_renamed_private_functions_keep_the_fingerprint(fingerprints):
    assert fingerprints["refactored"] == fingerprints["package"]


def test_a_changed_default_in_optim_changes_the_fingerprint(fingerprints):
    assert fingerprints["changed"] != fingerprints["package"]


KERNEL_PROBE = (
    "import sys; from convergent.studies.framework.canary import fingerprint_here, "
    "numerics_fingerprint; print(numerics_fingerprint() if sys.argv[1] == 'both' else '-', "
    "fingerprint_here())"
)
# What the fingerprint's interpreter must run with, written out here (not read from the module).
BASELINE = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2_Usable,-FMA_Usable,-FMA4_Usable,-AVX2,-FMA,-FMA4",
}


def _fingerprints(environments: list[dict[str, str]], both: bool = True) -> list[list[str]]:
    """(fingerprint, or "-" without ``both``; the canary bytes' hash on the process's own
    kernels) from one fresh process per environment (added to this one's), side by side."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", KERNEL_PROBE, "both" if both else "here"],
            env={**os.environ, **environment},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for environment in environments
    ]
    printed = []
    for child in children:
        stdout, stderr = child.communicate(timeout=300)
        assert child.returncode == 0, stderr
        printed.append(stdout.split())
    return printed


def test_the_fingerprints_interpreter_runs_the_baseline_kernels_and_nothing_inherited():
    inherited = {"PATH": "/bin", "MKL_CBWR": "AUTO", "OMP_PROC_BIND": "true", "DNNL_VERBOSE": "1"}
    environment = canary.baseline_environment(inherited)
    assert {k: environment[k] for k in BASELINE} == BASELINE
    assert environment["PATH"] == "/bin" and "OMP_PROC_BIND" not in environment
    assert "DNNL_VERBOSE" not in environment
    assert environment["OMP_NUM_THREADS"] == environment["MKL_NUM_THREADS"] == "1"


def test_the_fingerprint_names_the_code_not_the_cpus_kernels():
    # Another machine is out of reach; processes told to run other kernels are the same test.
    # Other kernels in the caller do not move the fingerprint, and leaving any one baseline
    # setting out of the others moves the canary's bytes on this machine (so each is needed
    # here; alone, glibc's setting moves nothing on a CPU whose ATen kernels skip libm).
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU runs the baseline kernels already: nothing to tell apart")
    other = {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_CBWR": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F",
    }
    plain, elsewhere = _fingerprints([{}, other])
    assert plain[1] != elsewhere[1]  # the kernels move the canary's last bits
    assert plain[0] == elsewhere[0]
    # A setting the environment leaves unset is the library's own default (glibc's: none).
    # oneDNN is off while the canary runs (its blocking follows the cache sizes): its ISA,
    # which moves the bytes when it is on, moves nothing, even on the CPU's own kernels. One
    # batch of processes for both (they run side by side).
    without = [{**BASELINE, name: ""} for name in BASELINE]
    onednn = [{"ONEDNN_MAX_CPU_ISA": "SSE41"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}]
    *runs, capped, widest = _fingerprints(without + onednn, both=False)
    unmoved = [name for name, run in zip(BASELINE, runs, strict=True) if run[1] == plain[0]]
    assert not unmoved, f"leaving these baseline settings out moved nothing here: {unmoved}"
    assert capped[1] == widest[1]


@pytest.fixture(scope="module")
def numbers() -> dict[str, torch.Tensor]:
    return canary.canary_numbers()


def test_a_changed_constant_read_at_run_time_changes_the_numbers(numbers, monkeypatch):
    before = numbers
    monkeypatch.setattr(horst, "DEFAULT_STRENGTH", 0.3)
    after = canary.canary_numbers()
    assert list(after) == list(before)
    moved = [name for name in before if not _same(before[name], after[name])]
    # HORST at its default strength runs in the optimizer runs and under the masks; the
    # others (explicit alpha, other optimizers, masks of untrained weights) do not move.
    assert "fit/horst-foreach/float64" in moved and "masked/acdc" in moved
    assert "fit/horst-alpha/float64" not in moved and "fit/adamw/float64" not in moved


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _draws() -> tuple[list[float], float, float]:
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def test_the_canary_ignores_and_restores_threads_default_dtype_random_states_and_logging(
    numbers,
):
    reference = numbers
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    level = logging.getLogger("convergent").level
    torch.set_num_threads(3)
    torch.set_default_dtype(torch.float64)
    _seed_everything(123)
    expected = _draws()
    _seed_everything(123)
    try:
        again = canary.canary_numbers()
        assert torch.get_num_threads() == 3 and torch.get_default_dtype() == torch.float64
        assert torch.backends.mkldnn.enabled  # oneDNN, off while the canary ran, is back on
        assert _draws() == expected
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
    assert logging.getLogger("convergent").level == level
    assert list(again) == list(reference)
    assert all(_same(again[name], reference[name]) for name in reference)


def test_the_canary_reads_every_part_and_its_numbers_are_finite(numbers):
    prefixes = {name.split("/")[0] for name in numbers}
    assert {
        "fit",
        "masked",
        "regularized",
        "descent",
        "masks",
        "wanda",
        "sparsegpt",
        "one-shot",
        "villani",
        "attention-spectra",
        "perturbed",
        "texts",
    } <= prefixes
    # (a strength row holds NaN where alpha was given rather than measured)
    checked = [value for name, value in numbers.items() if not name.startswith("strength")]
    assert all(bool(torch.isfinite(value.double()).all()) for value in checked)
