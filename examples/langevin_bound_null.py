"""What the `langevin` study's "bounded" statistics read where the theory holds exactly.

For every seed and penalty of a committed full run, this takes the penalty-only chain the run
stored (or, for a run that stored none, runs Langevin on the penalty alone here: no loss, the
setting in which the stationary radius r is exact, with that run's lam, s, step size, start
norms, length and record spacing) and prints, for the run and the chain, the per-matrix
statistic (max over the matrices of max(peak over the second half, upper end of the saturating
fit's asymptote interval) / r - 1) and the study's joint one (`joint_excess`: the same on the
matrices' joint norm over the joint radius). On LoRA's 64-entry matrices the per-matrix
statistic reads well above 0.1 at exact stationarity; the joint one does not.

Run: python examples/langevin_bound_null.py [docs/results/langevin-full/results.json]
(an earlier design's results, e.g. docs/results/langevin-full/history/design4.results.json.gz,
stored no chains: they are simulated here, about a minute per seed.)
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from convergent.studies.langevin import NULL_SEED_OFFSET, bound_of, joint_excess, null_runs


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/langevin-full/results.json")
    raw = path.read_bytes()
    results = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    config, data = results["config"], results["data"]
    bound = config["bound_temperature"]
    s = float(data["temperatures"][bound])
    print(f"{path} (design {data['design']}), {bound} s = {s:.3g}")
    for experiment, runs in data["runs"].items():
        for run in runs:
            records = run["phase2"][bound]
            # the run's own stored chain where there is one, else simulated here
            chains = run.get("null") or null_runs(records, s, config, int(run["seed"]))
            row = []
            for penalty, chain in chains.items():
                measured = bound_of(records[penalty]).excess
                alone = bound_of(chain).excess
                joint, joint_alone = joint_excess(records[penalty]), joint_excess(chain)
                row.append(
                    f"{penalty}: run {measured:+.3f}, penalty alone {alone:+.3f} (joint: run "
                    f"{joint:+.3f}, penalty alone {joint_alone:+.3f})"
                )
            print(f"  {experiment} seed {run['seed']}: " + "; ".join(row))
    print(f"(the chains' seeds are each run's seed + {NULL_SEED_OFFSET})")


if __name__ == "__main__":
    main()
