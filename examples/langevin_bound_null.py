"""What the `langevin` study's "bounded" statistic reads where the theory holds exactly.

For every seed and penalty of a committed full run, this runs Langevin on the penalty alone
(no loss: the setting in which the stationary radius r is exact) with that run's lam, s, step
size, start norms, length and record spacing, and prints the statistic designs 2 to 4 tested
against an absolute 10 %: max over the matrices of max(peak over the second half, upper end of
the saturating fit's asymptote interval) / r - 1. On LoRA's 64-entry matrices it reads well
above 0.1 at exact stationarity, which is why design 5 compares each run with this chain.

Run: python examples/langevin_bound_null.py [docs/results/langevin-full/results.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from convergent.studies.langevin_measures import bound_of
from convergent.studies.langevin_null import NULL_SEED_OFFSET, null_runs


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/langevin-full/results.json")
    results = json.loads(path.read_text())
    config, data = results["config"], results["data"]
    bound = config["bound_temperature"]
    s = float(data["temperatures"][bound])
    print(f"{path} (design {data['design']}), {bound} s = {s:.3g}")
    for experiment, runs in data["runs"].items():
        for run in runs:
            records = run["phase2"][bound]
            # the run's own stored chain where there is one (design 5), else simulated here
            chains = run.get("null") or null_runs(records, s, config, int(run["seed"]))
            row = []
            for penalty, chain in chains.items():
                measured = bound_of(records[penalty]).excess
                alone = bound_of(chain).excess
                row.append(f"{penalty}: run {measured:+.3f}, penalty alone {alone:+.3f}")
            print(f"  {experiment} seed {run['seed']}: " + "; ".join(row))
    print(f"(the chains' seeds are each run's seed + {NULL_SEED_OFFSET})")


if __name__ == "__main__":
    main()
