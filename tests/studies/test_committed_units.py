"""Every committed unit file is found under the key today's code gives it.

A unit file's name is a hash of its study, the full-mode config, the unit design, the numbers'
fingerprint and the unit's own description (`UnitCache.key`). A refactor of the studies must
leave that hash alone for every unit the full runs committed, or a resumed full run would
recompute hours of work it already has. Each file stores its unit and, since 2026-12-05, the
fingerprint it was computed under; an older file is tried under every fingerprint the committed
files name (the key is a hash: a wrong config or unit matches none of them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from convergent.studies import get_study
from convergent.studies.framework import UnitCache, json_ready
from convergent.studies.sparsity.finetune_config import finetune_settings
from convergent.studies.sparsity.finetune_runs import finetune_cache

ROOT = Path(__file__).resolve().parents[2]
IN_PROGRESS = ROOT / "docs" / "results" / "in-progress"


def _caches(name: str) -> list[UnitCache]:
    study = get_study(name)
    config = study.config("full")
    caches = [UnitCache("unused", name, json_ready(config), design=study.unit_design)]
    if name == "sparsity":  # part (c) keys its units by its own settings
        caches.append(finetune_cache("unused", finetune_settings(config)))
    return caches


def _committed() -> dict[str, list[tuple[str, dict]]]:
    found: dict[str, list[tuple[str, dict]]] = {}
    for folder in sorted(IN_PROGRESS.glob("*/units")):
        found[folder.parent.name] = [
            (path.stem, torch.load(path, weights_only=True, mmap=True))
            for path in sorted(folder.glob("*.pt"))
        ]
    return found


NAMES = ("descent", "langevin", "residual", "sparsity")


@pytest.fixture(scope="module")
def committed() -> dict[str, list[tuple[str, dict]]]:
    return _committed()


def test_the_committed_units_are_there_to_check(committed):
    assert set(committed) == set(NAMES)
    assert sum(len(files) for files in committed.values()) >= 477


@pytest.mark.parametrize("name", NAMES)
def test_every_committed_unit_file_is_named_by_todays_key(name, committed):
    fingerprints = sorted(
        {stored.get("numerics") for files in committed.values() for _, stored in files} - {None}
    )
    caches = _caches(name)
    lost = []
    for stem, stored in committed[name]:
        tried = [stored["numerics"]] if stored.get("numerics") else fingerprints
        keys = {cache.key(stored["unit"], numerics=f) for cache in caches for f in tried}
        if stem not in keys:
            lost.append(f"{stem}: {stored['unit']}")
    assert not lost, f"{len(lost)} committed {name} unit(s) no longer found:\n" + "\n".join(
        lost[:10]
    )
