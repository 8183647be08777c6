"""The ``residual`` study's parts: part (a)'s GD runs and step-size tuning, part (b)'s depth
runs, each a resumable unit of the framework's run."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from convergent.data import minilm_path
from convergent.studies.framework import (
    Measured,
    Report,
    Session,
    Study,
    UnitCache,
    json_ready,
    run_jobs,
)
from convergent.studies.residual.brief import advice, brief
from convergent.studies.residual.claims import DESIGN, FAMILIES, claims_from_results
from convergent.studies.residual.config import Config
from convergent.studies.residual.measures import regimes_of, worst_final_losses
from convergent.studies.residual.models import load_minilm
from convergent.studies.residual.report import depth_report, notes, one_layer_report
from convergent.studies.residual.runs import (
    DepthRun,
    GradientDescentRun,
    OneLayerJob,
    depth_run_to_dict,
    rt_sentence_data,
    train_one_depth,
    train_one_layer,
)
from convergent.studies.residual.summary import summary

# The design of this study's units (`Study.unit_design`).
UNIT_DESIGN = 1

Log = Callable[[str], None]


def _one_layer_batch(
    config: Config, units: UnitCache, log: Log, runs: list[tuple[str, float, int, float, int]]
) -> list[GradientDescentRun]:
    """The (part, lr, steps, beta, seed) runs, cached, pending ones on ``config.workers``
    processes (the values do not depend on how many)."""
    jobs = [
        OneLayerJob(
            part,
            lr,
            steps,
            beta,
            seed,
            config.window,
            config.examples,
            config.d_model,
            config.d_ff,
            config.resolved_init_std,
            config.spectra_every,
        )
        for part, lr, steps, beta, seed in runs
    ]
    values = run_jobs(units, jobs, train_one_layer, config.workers)
    out = [GradientDescentRun(**value) for value in values]
    for job, run in zip(jobs, out, strict=True):
        log(
            f"{job.part} lr={job.lr:g} beta={job.beta} seed={job.seed}: loss "
            f"{run.losses[0]:.4f} -> {run.losses[-1]:.4f} in {run.seconds:.1f} s"
        )
    return out


def select_step_size(rows: list[dict[str, Any]]) -> float:
    """One beta's tuned step size from its tuning rows (one per step size and selection seed):
    among the step sizes that diverged from no seed, the one whose worst final loss is lowest
    (ties: the smaller step); NaN when every step size diverged from some seed."""
    stable = [(loss, lr) for lr, loss in worst_final_losses(rows).items() if loss < math.inf]
    return min(stable)[1] if stable else math.nan


def _one_layer_runs(
    config: Config, units: UnitCache, log: Log
) -> tuple[list[GradientDescentRun], list[dict[str, Any]], list[GradientDescentRun]]:
    """Part (a): the fixed-step regimes' runs, the tuning rows and the tuned regime's runs.

    One cached unit per (regime, seed, beta), per tuning (lr, beta) and per tuned (seed, beta).
    """
    fixed = [
        ("one_layer", lr, steps, beta, seed)
        for lr, steps in config.regimes
        for seed in config.seeds
        for beta in config.betas
    ]
    trials = [
        ("lr_tuning", lr, config.tuning_steps, beta, selection_seed)
        for beta in (config.betas if config.tuned_lrs else ())
        for lr in config.tuned_lrs
        for selection_seed in config.selection_seeds
    ]
    # The fixed regimes and the tuning trials are independent: one batch for the workers.
    done = _one_layer_batch(config, units, log, fixed + trials)
    runs = done[: len(fixed)]
    tuning: list[dict[str, Any]] = []
    selected_lrs: dict[float, float] = {}
    for beta in config.betas if config.tuned_lrs else ():
        rows = [
            {
                "beta": float(beta),
                "lr": float(lr),
                "seed": int(seed),
                "final_loss": float(trial.losses[-1]),
                "diverged": bool(trial.diverged),
            }
            for (_, lr, _, trial_beta, seed), trial in zip(trials, done[len(fixed) :], strict=True)
            if trial_beta == beta
        ]
        selected = select_step_size(rows)
        for row in rows:
            row["selected"] = row["lr"] == selected
        tuning += rows
        if math.isfinite(selected):
            selected_lrs[beta] = selected
        else:
            log(f"beta={beta}: every tuning run diverged; no tuned runs")
    tuned_runs = [
        ("one_layer_tuned", lr, config.tuned_steps, beta, seed)
        for beta, lr in selected_lrs.items()
        for seed in config.seeds
    ]
    tuned = _one_layer_batch(config, units, log, tuned_runs)
    return runs, tuning, tuned


def _depth_runs(config: Config, units: UnitCache, log: Log) -> list[DepthRun]:
    """Part (b): one cached unit per (seed, depth, beta); MiniLM and rt-sentences are loaded
    only if a unit has to be computed."""
    pretrained = functools.cache(lambda: load_minilm(minilm_path()))
    sentences = functools.cache(
        lambda: rt_sentence_data(
            config.max_length, config.train_examples, config.validation_examples
        )
    )
    runs = []
    for seed in config.seeds:
        for depth in config.depths:
            for beta in config.depth_betas:

                def compute(depth: int = depth, beta: float = beta, seed: int = seed) -> dict:
                    train, validation = sentences()
                    run = train_one_depth(
                        pretrained(),
                        train,
                        validation,
                        depth,
                        beta,
                        seed,
                        steps=config.depth_steps,
                        batch_size=config.depth_batch_size,
                        lr=config.depth_lr,
                    )
                    return depth_run_to_dict(run)

                unit = {
                    "part": "depth",
                    "depth": int(depth),
                    "beta": float(beta),
                    "seed": int(seed),
                }
                run = DepthRun(**units.run(unit, compute))
                log(
                    f"depth={depth} beta={beta} seed={seed}: final loss {run.losses[-1]:.3f},"
                    f" validation error {run.validation_error:.3f} ({run.seconds:.0f} s)"
                )
                runs.append(run)
    return runs


class ResidualStudy:
    """The ``residual`` study for the framework (:class:`~convergent.studies.framework.Study`)."""

    name = "residual"
    design = DESIGN
    unit_design = UNIT_DESIGN
    config = staticmethod(Config.for_mode)
    families = FAMILIES
    claims_from_results = staticmethod(claims_from_results)
    summary = staticmethod(summary)
    brief = staticmethod(brief)
    advice = staticmethod(advice)

    def reserved_seeds(self, config: Config) -> set[int]:
        return set(config.selection_seeds)

    def threads(self, config: Config) -> int:
        # Part (a)'s runs hold themselves to one thread each (`runs.train_one_layer`); part
        # (b)'s run on torch's own thread count.
        return torch.get_num_threads()

    def measure(self, config: Config, session: Session) -> Measured:
        """Parts (a) and (b): each (regime, seed, beta) run of part (a), each tuning run and
        each (seed, depth, beta) run of part (b) is a unit (a rerun reuses the finished ones)."""
        gd_runs, tuning, tuned_runs = _one_layer_runs(config, session.cache, session.log)
        data: dict[str, Any] = {
            "one_layer_runs": [vars(run) for run in gd_runs],
            "lr_tuning": tuning,
            "tuned_runs": [vars(run) for run in tuned_runs],
        }
        if config.run_depth:
            depth_runs = _depth_runs(config, session.cache, session.log)
            data["depth_runs"] = [vars(run) for run in depth_runs]
        return Measured(data)

    def report(self, config: Config, measured: Measured, folder: Path) -> Report:
        data = measured.data
        # The regimes as the claims see them, from the stored form.
        regimes = regimes_of(json_ready(config), json_ready(data))
        gd_runs = [GradientDescentRun(**run) for run in data["one_layer_runs"]]
        tuned_runs = [GradientDescentRun(**run) for run in data["tuned_runs"]]
        tables, figures = one_layer_report(
            config, regimes, gd_runs, data["lr_tuning"], tuned_runs, folder
        )
        if config.run_depth:
            depth_tables, depth_figures = depth_report(
                [DepthRun(**run) for run in data["depth_runs"]], folder
            )
            tables.update(depth_tables)
            figures += depth_figures
        lines = notes(config)
        if config.mode == "smoke":
            lines.append("Smoke size: one seed, so every verdict is a preview.")
        return Report(tables, figures, lines)


STUDY: Study = ResidualStudy()
