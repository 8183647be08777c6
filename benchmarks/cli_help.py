"""How long ``convergent --help`` and every ``convergent CMD --help`` take, as a user waits for
them: a fresh process each, the median of ``--repeats``.

Target: at most 1 s each. References measured in the same run: a bare interpreter start
(``python -c pass``, the floor), and the same help printed by the real parser (what
``--help`` cost before it was replayed from ``convergent/cli_help.json``: it imports torch).

    python benchmarks/cli_help.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

TARGET_SECONDS = 1.0
COMMANDS = ((), ("train",), ("data",), ("data", "fetch"), ("prune",), ("diagnose",),
            ("reproduce",), ("report",))  # fmt: skip
REAL_PARSER = (
    "import sys; from convergent.cli import build_parser; build_parser().parse_args(sys.argv[1:])"
)


def seconds(command: list[str], repeats: int) -> float:
    """The median wall time of ``command`` in a fresh process."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, check=False)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="processes per command")
    arguments = parser.parse_args()
    floor = seconds([sys.executable, "-c", "pass"], arguments.repeats)
    print(f"python -c pass: {floor:.3f} s (the floor)")
    print("| command | --help | real parser | real / replayed | <= 1 s |")
    print("|---|---|---|---|---|")
    for words in COMMANDS:
        argv = [*words, "--help"]
        replayed = seconds([sys.executable, "-m", "convergent", *argv], arguments.repeats)
        real = seconds([sys.executable, "-c", REAL_PARSER, *argv], arguments.repeats)
        met = "yes" if replayed <= TARGET_SECONDS else "no"
        name = " ".join(("convergent", *argv))
        print(f"| {name} | {replayed:.3f} s | {real:.2f} s | {real / replayed:.0f}x | {met} |")


if __name__ == "__main__":
    main()
