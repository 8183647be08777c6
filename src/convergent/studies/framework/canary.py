"""The numbers' fingerprint: a tiny canary run through the library's numerical code, hashed.

A finished study unit stays valid while the code it ran computes the same numbers. A hash of
the source cannot tell a comment from a changed constant, so `numerics_fingerprint` runs the
library's numerical code on tiny fixed inputs (the runs of :mod:`.canary_runs`: models,
every optimizer, the training steps, the pruners, the diagnostics and the data perturbations)
and hashes the exact bytes of what comes out, with torch's version (and those of
`VERSIONED`).

It reads no file, and runs under `_isolated`: one thread and torch's default dtype, with the
thread count, the default dtype and the random states restored afterwards. The fingerprint is
computed in a fresh interpreter on the CPU's baseline kernels (`BASELINE_KERNELS`), so that it
names the code (and the C library's version) rather than the vector width: CPUs of one vendor
agree, but an AMD and an Intel x86-64 CPU were seen to differ. docs/design.md ("Unit keys")
says what it cannot see, and how committed units move to a new machine's keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from convergent.studies.framework.canary_runs import PARTS, STUDY_PRUNER_OPTIONS

__all__ = [
    "STUDY_PRUNER_OPTIONS",
    "baseline_environment",
    "canary_numbers",
    "fingerprint_here",
    "numerics_fingerprint",
    "tensors_digest",
]

FINGERPRINT_DIGITS = 16
# The kernels every x86-64 CPU runs alike, set for the fingerprint's own interpreter (each is
# read when its library starts; each moves the canary's bytes on a current CPU): ATen's
# unvectorized kernels, MKL's conditional numerical reproducibility mode (the same results on
# Intel and AMD CPUs), and glibc's libm without its FMA/AVX2 variants of exp, log, pow, ...
# (chosen at load time by the CPU; both spellings of glibc's hwcaps names). oneDNN is not
# capped but switched off (`_isolated`): its blocking follows the CPU's cache sizes.
BASELINE_KERNELS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2_Usable,-FMA_Usable,-FMA4_Usable,-AVX2,-FMA,-FMA4",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# Settings of these libraries that the caller's environment may hold: none reaches the child.
KERNEL_SETTINGS = ("ATEN_", "MKL_", "ONEDNN_", "DNNL_", "OMP_", "KMP_", "GOMP_", "GLIBC_")
# Runs `fingerprint_here` with ``argv[1]`` (the caller's ``sys.path``, JSON) as its path, so
# that it imports the caller's own copies of the package and its dependencies.
FINGERPRINT_PROBE = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from convergent.studies.framework.canary import fingerprint_here; print(fingerprint_here())"
)
FINGERPRINT_PATTERN = re.compile(f"[0-9a-f]{{{FINGERPRINT_DIGITS}}}")
# Packages whose numbers the canary cannot reach cheaply (importing them takes seconds) but
# whose upgrades can move a study's numbers (the descent study's MiniLM, LoRA).
VERSIONED = ("transformers", "peft")


@contextlib.contextmanager
def _isolated() -> Iterator[None]:
    """torch's defaults while the canary runs, and everything as it was afterwards.

    One thread: LayerNorm's backward sums its weight gradients per thread, so the thread count
    moves the last bits. The default dtype float32: the models are initialized in it, then
    cast. The CPU random states (Python, NumPy, torch; CUDA is never touched, not even
    initialized): restored, so a study that keys its units before it runs them computes the
    same numbers as one that does not. The library's info lines (a Langevin temperature, a
    layer left dense) would describe runs nobody asked for: warnings only. oneDNN off: its
    kernels' blocking reads the CPU's cache sizes, so two CPUs on the same instructions could
    still sum in two orders; without it ATen's own kernels and MKL's (reproducible across
    vendors in `BASELINE_KERNELS`) compute everything (at an AMD/Intel split seen on
    2026-12-05, before this, the baseline fingerprints differed).
    """
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    onednn = torch.backends.mkldnn.enabled
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    logger = logging.getLogger("convergent")
    level = logger.level
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a ContextProp
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
        torch.backends.mkldnn.enabled = onednn
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def canary_numbers() -> dict[str, Tensor]:
    """Every number of the canary run by name, in a fixed order (float64 where torch allows),
    computed under `_isolated`."""
    with _isolated():
        return {name: value.detach().cpu() for part in PARTS for name, value in part()}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@cache
def numerics_fingerprint() -> str:
    """`fingerprint_here` computed in a fresh interpreter, on the caller's ``sys.path``, with
    `baseline_environment`, so that the CPU's vector width does not move it (CPUs of two
    vendors were still seen to differ: docs/design.md, "Unit keys"); once per process (about
    3 s).

    The CPU's own kernels (ATen's widest vectors, MKL's and libm's per-CPU code paths) move
    the last bits of the canary, and through them every key: units then could not move between
    machines, and a run that spans sessions on machines of two kinds would start over at each
    change. The baseline kernels are the same instructions everywhere.
    """
    try:
        child = subprocess.run(
            [sys.executable, "-c", FINGERPRINT_PROBE, json.dumps(sys.path)],
            env=baseline_environment(os.environ),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise RuntimeError("the numbers' fingerprint took more than 600 s") from error
    printed = child.stdout.strip().splitlines()
    if child.returncode != 0 or not printed or not FINGERPRINT_PATTERN.fullmatch(printed[-1]):
        raise RuntimeError(
            f"the numbers' fingerprint could not be computed: {child.stderr[-2000:]}"
        )
    return printed[-1]


def baseline_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without its `KERNEL_SETTINGS`, with `BASELINE_KERNELS`."""
    kept = {k: v for k, v in environment.items() if not k.startswith(KERNEL_SETTINGS)}
    return {**kept, **BASELINE_KERNELS}


def fingerprint_here() -> str:
    """A short hash of `canary_numbers` (names, dtypes, shapes and exact bytes), of
    ``torch.__version__`` and of the installed versions of `VERSIONED`, on the kernels this
    process runs (a machine's own, unless `BASELINE_KERNELS` was set before torch started)."""
    digest = hashlib.sha256(f"torch {torch.__version__}".encode())
    for package in VERSIONED:
        digest.update(f"\0{package} {_version(package)}".encode())
    _update_with_tensors(digest, canary_numbers())
    return digest.hexdigest()[:FINGERPRINT_DIGITS]


def tensors_digest(tensors: Mapping[str, Tensor]) -> str:
    """A short hash of named tensors (names, dtypes, shapes and exact bytes, in name order): what
    a unit computed from other tensors, such as a fine-tune from pretrained weights, puts in
    its key so that different inputs never share a cached result."""
    digest = hashlib.sha256()
    _update_with_tensors(digest, {name: tensors[name] for name in sorted(tensors)})
    return digest.hexdigest()[:FINGERPRINT_DIGITS]


def _update_with_tensors(digest: Any, tensors: Mapping[str, Tensor]) -> None:
    for name, value in tensors.items():
        tensor = value.detach().cpu().contiguous()
        digest.update(f"\0{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype
