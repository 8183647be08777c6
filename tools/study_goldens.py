"""The studies' refactoring gate: the four smoke runs, recorded once and checked after a change.

``record`` runs every study at smoke size into ``tests/studies/goldens/<fingerprint>/`` and
keeps each study's ``report.md`` and ``results.json`` (less what measures the run itself: its
wall time and which units it reused) beside the units it computed. ``check`` runs them again
into a scratch folder seeded with those units and fails unless

- no unit is computed (every unit the changed code asks for has the key it had), and
- every report and results file is byte-identical to the recorded one.

The numbers depend on the machine (the numbers' fingerprint, `numerics_fingerprint`), so the
goldens live under the fingerprint they were recorded with; on another machine ``check`` says
so and records nothing. Usage::

    python tools/study_goldens.py record [--written OUT]
    python tools/study_goldens.py check
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "tests" / "studies" / "goldens"
STUDIES = ("descent", "langevin", "residual", "sparsity")
# What a run says about itself rather than about the study.
RUN_LINES = re.compile(r"unit\(s\) reused from|^Run time: ")


def _fingerprint() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from convergent.studies.framework.canary import numerics_fingerprint

    return numerics_fingerprint()


def _reproduce(out: Path) -> None:
    command = [sys.executable, "-m", "convergent", "reproduce", *STUDIES, "--smoke"]
    command += ["--out", str(out), "--no-progress"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(command, check=True, cwd=ROOT, env=environment)


def _normalised_report(text: str) -> str:
    return "".join(line for line in text.splitlines(True) if not RUN_LINES.search(line))


def _normalised_results(text: str) -> str:
    payload = json.loads(text)
    payload.pop("seconds", None)
    payload["notes"] = [note for note in payload.get("notes", []) if not RUN_LINES.search(note)]
    return json.dumps(payload, indent=2, sort_keys=True) + "\n"


def _outputs(folder: Path) -> dict[str, str]:
    out = {}
    for study in STUDIES:
        out[f"{study}/report.md"] = _normalised_report((folder / study / "report.md").read_text())
        out[f"{study}/results.json"] = _normalised_results(
            (folder / study / "results.json").read_text()
        )
    return out


def _computed(folder: Path) -> dict[str, int]:
    counts = {}
    for study in STUDIES:
        notes = json.loads((folder / study / "results.json").read_text()).get("notes", [])
        for note in notes:
            found = re.search(r"(\d+) computed", note)
            if "unit(s) reused from" in note and found:
                counts[study] = counts.get(study, 0) + int(found.group(1))
    return counts


def record(written: Path | None) -> int:
    target = GOLDENS / _fingerprint()
    with tempfile.TemporaryDirectory() as scratch:
        out = written or Path(scratch)
        if written is None:
            _reproduce(out)
        if target.exists():
            shutil.rmtree(target)
        for name, text in _outputs(out).items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_text(text)
        for study in STUDIES:
            shutil.copytree(out / study / "units", target / study / "units")
    print(f"recorded the smoke goldens in {target.relative_to(ROOT)}")
    return 0


def check() -> int:
    source = GOLDENS / _fingerprint()
    if not source.is_dir():
        print(f"no goldens for this machine's numbers ({source.name}); run 'record' first")
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        for study in STUDIES:
            shutil.copytree(source / study / "units", out / study / "units")
        _reproduce(out)
        computed = {study: n for study, n in _computed(out).items() if n}
        failures = [f"{study}: {n} unit(s) computed afresh" for study, n in computed.items()]
        for name, text in _outputs(out).items():
            golden = (source / name).read_text()
            if text != golden:
                diff = difflib.unified_diff(
                    golden.splitlines(True), text.splitlines(True), name, name + " (now)", n=1
                )
                failures.append("".join(list(diff)[:40]))
    if failures:
        print("the smoke goldens differ:\n" + "\n".join(failures))
        return 1
    print(f"the four smoke runs match {source.relative_to(ROOT)}: every unit reused, files equal")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument(
        "--written", type=Path, help="record: a fresh smoke run's OUT folder, instead of a new run"
    )
    arguments = parser.parse_args()
    return record(arguments.written) if arguments.action == "record" else check()


if __name__ == "__main__":
    sys.exit(main())
