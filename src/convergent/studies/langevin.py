"""Study `langevin`: Langevin training of W_Q, W_K (and of LoRA factors) with Villani regularizers.

Frangi et al. (2026) claim that Langevin dynamics on attention's W_Q, W_K, with a light
log-amplified or super-quadratic regularizer, converges; that without one the norms of W_Q
and W_K grow without bound and the generalization gap creeps up; and that accuracy is about
the same either way. This study puts those claims to a small test on darcy-16:

1. a ViT-style regressor (our `Transformer`, one head, 4x4 patches as 16 tokens, one 16-value
   output per patch, i.e. the 16x16 solution field) is pre-trained in full with AdamW;
2. only W_Q and W_K then train under Langevin, three ways: no regularizer, log-amplified,
   super-quadratic (power); norms, train and test RMSE, relative L2 error and the gap
   (test RMSE - train RMSE) are tracked;
3. the LoRA variant: a depth-2 network, pre-trained in full, then PEFT LoRA factors on q/k
   train under Langevin the same three ways, with the factor norms tracked.

"Light" is made precise before any Langevin step by one rule, the same for both penalties
(`lam_rule="radius"`): with a flat loss, the penalty alone would put the most likely ||W||_F at
`radius_factor` (2) times its value at the start of phase 2, at the run's temperature s / 2
(`convergent.regularize.lam_for_stationary_radius`). The alternative rule
`lam_rule="loss_fraction"` makes the penalty 1 % of the training loss at the start; at s = 2 / N
it is so light that its stationary radius is ~10x the start norm, far beyond what a run of a
few thousand steps reaches, so both rules are kept and the report prints the stationary radius
of the lam it used. The claims and their checks are scored from the stored traces alone
(`langevin_claims`); each (experiment, seed) is one unit of the resumable `UnitCache`.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from convergent.data.splits import DictDataset
from convergent.studies.common import StudyResult, json_ready
from convergent.studies.langevin_claims import claims_from_results
from convergent.studies.langevin_config import VARIANTS, Config
from convergent.studies.langevin_parts import gradient_rms, patch_ordered_splits, run_experiment
from convergent.studies.langevin_report import plot_traces, run_notes, tables_and_summary
from convergent.studies.units import UnitCache

__all__ = ["VARIANTS", "Config", "gradient_rms", "run", "run_experiment"]


def run(config: Config, out_dir: str | Path, progress: bool = True) -> StudyResult:
    """Run the study; figures go into `out_dir` (the caller writes report.md / results.json)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _run(config, Path(out_dir), progress)
    finally:
        torch.set_num_threads(threads)


def _run_job(
    job: tuple[Config, int, str, float, bool], data: tuple[DictDataset, DictDataset] | None = None
) -> dict[str, Any]:
    """One experiment for one seed (a top-level function, so that a process pool can run it)."""
    config, seed, experiment, s, progress = job
    torch.set_num_threads(config.threads)
    train, test = data if data is not None else patch_ordered_splits(config.train_examples)
    if progress:
        label = "W_Q/W_K" if experiment == "attention" else "LoRA"
        print(f"langevin: seed {seed}: {label} runs", flush=True)
    return run_experiment(experiment, config, seed, train, test, s)


def _run_units(
    jobs: list[tuple[Config, int, str, float, bool]],
    cache: UnitCache,
    data: tuple[DictDataset, DictDataset],
    workers: int,
) -> list[dict[str, Any]]:
    """Each job's outcome, from the cache or computed (in `workers` processes); the parent
    stores each unit as soon as it finishes, so an interruption loses only the units in flight."""
    units = [{"experiment": experiment, "seed": seed} for _, seed, experiment, _, _ in jobs]
    outcomes: list[dict[str, Any] | None] = [cache.get(unit) for unit in units]
    cache.hits += sum(outcome is not None for outcome in outcomes)
    pending = [index for index, outcome in enumerate(outcomes) if outcome is None]
    if workers > 1 and len(pending) > 1:
        # Jobs are independent and deterministic: running them in processes changes nothing
        # but the wall time.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(_run_job, jobs[index]): index for index in pending}
            for future in as_completed(futures):
                index = futures[future]
                outcomes[index] = cache.run(units[index], future.result)
    else:
        for index in pending:
            outcomes[index] = cache.run(units[index], partial(_run_job, jobs[index], data))
    return [outcome for outcome in outcomes if outcome is not None]


def _run(config: Config, out: Path, progress: bool) -> StudyResult:
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    train, test = patch_ordered_splits(config.train_examples)
    s = config.s if config.s is not None else 2.0 / len(train)
    runs: dict[str, list[dict[str, Any]]] = {"attention": [], "lora": []}
    jobs = [(config, seed, experiment, s, progress) for seed in config.seeds for experiment in runs]
    cache = UnitCache(out / "units", "langevin", json_ready(config))
    outcomes = _run_units(jobs, cache, (train, test), config.workers)
    for (_, _, experiment, _, _), outcome in zip(jobs, outcomes, strict=True):
        runs[experiment].append(outcome)
    tables, summary = tables_and_summary(config, runs)
    data = {"s": s, "summary": summary, "runs": runs}
    # Scored from the JSON form, by the same code that re-scores a committed results.json.
    claims = claims_from_results({"config": json_ready(config), "data": json_ready(data)})
    figures = plot_traces(runs, out)
    notes = [*run_notes(config, runs, s, len(train)), cache.summary() + "."]
    return StudyResult(
        name="langevin",
        mode=config.mode,
        config=replace(config),
        tables=tables,
        claims=claims,
        figures=figures,
        data=data,
        notes=notes,
        seconds=time.perf_counter() - started,
    )


__all__ = ["Config", "claims_from_results", "gradient_rms", "run", "run_experiment"]
