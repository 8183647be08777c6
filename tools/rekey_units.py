"""Move the committed study units to their keys under this machine's numbers' fingerprint.

A unit's key hashes `numerics_fingerprint`, and machines of two CPU vendors have computed
different fingerprints for the same code (docs/design.md, "Unit keys"); a session on such a
machine then finds none of the committed units. This script checks, for every unit file under
the committed folders below, that its name is its key under one of the ``OLD`` fingerprints
given or the one the file stored (the machine that computed it; an earlier session's note or
`git log` names it), then, with ``--apply``, renames it to its key under this machine's
fingerprint (``git mv``; a plain rename for a unit git does not track yet). A file already
keyed under this machine's fingerprint counts as in place. A file whose name is not its key
under any old fingerprint, or whose new name is taken, stops the script before anything
moves: it was computed by other code, and only a run may replace it.

    .venv/bin/python tools/rekey_units.py OLD            # check only
    .venv/bin/python tools/rekey_units.py OLD --apply    # check, then move
    .venv/bin/python tools/rekey_units.py --apply        # each file's stored fingerprint
    .venv/bin/python tools/rekey_units.py OLD1 OLD2 --skip in-progress/descent --apply

Run it only on a checkout whose numerical code is the code that computed the units (the same
commit, or one whose changes left the old machine's fingerprint unchanged).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from convergent.studies.framework import json_ready, tensors_digest
from convergent.studies.framework.canary import numerics_fingerprint
from convergent.studies.framework.units import UnitCache

RESULTS = Path("docs/results")


def _caches() -> dict[Path, list[UnitCache]]:
    """Each committed unit folder and the caches whose units it may hold."""
    from convergent.studies import get_study
    from convergent.studies.descent import pilot as descent_pilot
    from convergent.studies.descent.config import Config as DescentConfig
    from convergent.studies.sparsity import pilot as sparsity_pilot

    def full(name: str) -> UnitCache:
        study = get_study(name)
        return UnitCache(".", name, json_ready(study.config("full")), design=study.unit_design)

    language = dataclasses.replace(
        DescentConfig.for_mode("full"),
        selection_seed=descent_pilot.PILOT_SEEDS[0],
        seeds=descent_pilot.PILOT_SEEDS[1:],
        workers=2,
    )
    progress = RESULTS / "in-progress"
    return {
        progress / name / "units": [full(name)]
        for name in ("sparsity", "residual", "langevin", "descent")
    } | {
        RESULTS / "pilots/sparsity-design3/sparsity-pilot/units": [
            sparsity_pilot.pilot_cache(".", sparsity_pilot.pilot_config(regime))
            for regime in sparsity_pilot.PILOT_REGIMES
        ],
        RESULTS / "pilots/descent-design3/descent-pilot/units": [
            UnitCache(
                ".",
                "descent-pilot",
                json_ready(descent_pilot.pilot_config(layers, None, 2)),
                design=descent_pilot.PILOT_UNIT_DESIGN,
            )
            for layers in descent_pilot.PILOT_DEPTHS
        ]
        + [
            UnitCache(
                ".",
                "descent-language-pilot",
                json_ready(language),
                design=descent_pilot.LANGUAGE_PILOT_UNIT_DESIGN,
            )
        ],
    }


def _keyed_unit(unit: Mapping[str, Any], starts: list[str]) -> Mapping[str, Any]:
    """``unit`` as its key reads it: a language fine-tune stored before its key named the
    pretrained weights it starts from keys with their digest (the folder's one pretraining)."""
    fine_tune = unit.get("part") == "language" and unit.get("method") != "pretrain"
    if not fine_tune or "start" in unit:
        return unit
    if len(starts) != 1:
        raise SystemExit(f"a fine-tune needs one pretraining beside it, found {len(starts)}")
    return {**unit, "start": starts[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "old",
        nargs="*",
        help="the fingerprints the units may be keyed under (besides the one each file stored, "
        "which files written since 2026-12-05 do)",
    )
    parser.add_argument("--apply", action="store_true", help="move the files (git mv)")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        help="leave folders whose path contains this alone (a run still writing there)",
    )
    arguments = parser.parse_args()
    new = numerics_fingerprint()
    named = ", ".join(arguments.old) or "each file's stored fingerprint"
    print(f"keys under {named} -> keys under {new}")
    moves: list[tuple[Path, Path]] = []
    unverified: list[Path] = []
    placed = 0
    for folder, caches in _caches().items():
        if any(part in str(folder) for part in arguments.skip):
            print(f"{folder}: skipped")
            continue
        stored = {path: torch.load(path, weights_only=True) for path in sorted(folder.glob("*.pt"))}
        starts = [
            tensors_digest(entry["value"]["state"])
            for entry in stored.values()
            if entry["unit"].get("method") == "pretrain"
        ]
        for path, entry in stored.items():
            unit = _keyed_unit(entry["unit"], starts)
            if any(cache.key(unit) == path.stem for cache in caches):
                placed += 1  # keyed under this machine's numbers already (moved, or run here)
                continue
            olds = [*arguments.old, *([entry["numerics"]] if entry.get("numerics") else [])]
            owners = [c for c in caches if any(c.key(unit, old) == path.stem for old in olds)]
            if len(owners) != 1:
                unverified.append(path)
                continue
            moves.append((path, folder / f"{owners[0].key(unit)}.pt"))
        print(f"{folder}: {len(stored)} file(s)")
    taken = [target for _, target in moves if target.exists()]
    print(
        f"{len(moves)} to move, {placed} in place, {len(unverified)} not keyed under the old "
        f"fingerprint, {len(taken)} whose new name is taken"
    )
    for path in unverified:
        print(f"  not its key: {path}")
    for path in taken:
        print(f"  taken: {path}")
    if unverified or taken:
        sys.exit(1)
    if arguments.apply:
        for source, target in moves:
            tracked = subprocess.run(
                ["git", "ls-files", "--error-unmatch", str(source)],
                check=False,
                capture_output=True,
            )
            if tracked.returncode == 0:
                subprocess.run(["git", "mv", str(source), str(target)], check=True)
            else:  # a unit git does not track yet (a run in progress)
                source.rename(target)
        print(f"moved {len(moves)} file(s)")


if __name__ == "__main__":
    main()
