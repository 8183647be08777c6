"""The ``residual`` study's parts: part (a)'s GD runs and step-size tuning, part (b)'s depth
runs, each a resumable unit of the framework's run."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from convergent.studies.engine import Selection, Unit, run_units, select
from convergent.studies.framework import (
    Measured,
    Report,
    Session,
    Study,
    Tuning,
    UnitCache,
    json_ready,
)
from convergent.studies.residual.claims import DESIGN, FAMILIES, claims_from_results
from convergent.studies.residual.config import Config
from convergent.studies.residual.measures import regimes_of, worst_final_losses
from convergent.studies.residual.report import depth_report, notes, one_layer_report
from convergent.studies.residual.runs import (
    DepthRun,
    GradientDescentRun,
    minilm,
    sentences,
    train_depth_unit,
    train_one_layer,
)
from convergent.studies.residual.summary import advice, brief, summary

# The design of this study's units (`Study.unit_design`).
UNIT_DESIGN = 1

Log = Callable[[str], None]


def one_layer_unit(
    config: Config, part: str, lr: float, steps: int, beta: float, seed: int
) -> Unit:
    """One full-batch GD run of part (a), keyed by its (part, lr, steps, beta, seed)."""
    key = dict(part=part, lr=float(lr), steps=int(steps), beta=float(beta), seed=int(seed))
    keywords = dict(d_model=config.d_model, d_ff=config.d_ff, init_std=config.resolved_init_std)
    keywords["spectra_every"] = config.spectra_every
    data = (config.window, config.examples)
    return Unit(key, train_one_layer, (lr, steps, beta, seed, data, keywords))


def tuning_row(value: dict[str, Any]) -> dict[str, Any]:
    """A tuning unit's row of ``results.json``'s ``lr_tuning`` (less ``selected``)."""
    return {
        "beta": float(value["beta"]),
        "lr": float(value["lr"]),
        "seed": int(value["seed"]),
        "final_loss": float(value["losses"][-1]),
        "diverged": bool(value["diverged"]),
    }


def worst_over_seeds(units: list[dict[str, Any]]) -> Callable[[dict[str, Any]], float]:
    """The step-size rule (`engine.Rule`) over one beta's tuning units, one per (lr, selection
    seed): a unit's score is its step size's worst final loss over the seeds, NaN (never
    selected) when it diverged from any of them."""
    worst = worst_final_losses([tuning_row(unit) for unit in units])
    return lambda unit: worst[unit["lr"]] if worst[unit["lr"]] < math.inf else math.nan


def step_size_selection(config: Config) -> Selection:
    """Part (a)'s step-size selection: per beta (a method named ``beta=B``), the grid of step
    sizes (ascending, so that a tie goes to the smaller step) x selection seeds, each a
    ``lr_tuning`` unit, scored by `worst_over_seeds`."""
    betas = {f"beta={beta}": beta for beta in config.betas}
    axes: dict[str, list[Any]] = {
        "lr": sorted(config.tuned_lrs),
        "seed": list(config.selection_seeds),
    }
    return Selection(
        grids={name: axes for name in betas},
        unit=lambda name, point: one_layer_unit(
            config, "lr_tuning", point["lr"], config.tuning_steps, betas[name], point["seed"]
        ),
        rule=worst_over_seeds,
        maximize=False,
        criterion="worst final training loss over the selection seeds",
        per_method=True,
    )


def selected_step_size(tuning: Tuning[dict[str, Any]]) -> float:
    """One beta's selected step size; NaN when every step size diverged from some seed."""
    lost = not math.isfinite(tuning.scores[tuning.selected])
    return math.nan if lost else float(tuning.selected_point["lr"])


def _one_layer_runs(
    config: Config, cache: UnitCache, log: Log
) -> tuple[list[GradientDescentRun], list[dict[str, Any]], list[GradientDescentRun]]:
    """Part (a): the fixed-step regimes' runs, the tuning rows and the tuned regime's runs (one
    unit per (regime, seed, beta), tuning (lr, seed, beta) and tuned (seed, beta))."""
    tuning: list[dict[str, Any]] = []
    selected_lrs: dict[float, float] = {}
    if config.tuned_lrs:
        selected = select(step_size_selection(config), cache, config.workers, log)
        for beta in config.betas:
            chosen = selected.tunings[f"beta={beta}"]
            lr = selected_step_size(chosen)
            found = {(unit["lr"], unit["seed"]): tuning_row(unit) for unit in chosen.runs}
            tuning += [
                {**found[float(trial), seed], "selected": float(trial) == lr}
                for trial in config.tuned_lrs
                for seed in config.selection_seeds
            ]
            if math.isfinite(lr):
                selected_lrs[beta] = lr
            else:
                log(f"beta={beta}: every tuning run diverged; no tuned runs")
    fixed = [
        one_layer_unit(config, "one_layer", lr, steps, beta, seed)
        for lr, steps in config.regimes
        for seed in config.seeds
        for beta in config.betas
    ]
    tuned = [
        one_layer_unit(config, "one_layer_tuned", lr, config.tuned_steps, beta, seed)
        for beta, lr in selected_lrs.items()
        for seed in config.seeds
    ]
    # The fixed regimes and the tuned runs are independent: one batch for the workers.
    runs = [
        GradientDescentRun(**value)
        for value in run_units(cache, fixed + tuned, config.workers, log)
    ]
    for run in runs:
        log(
            f"lr={run.lr:g} steps={run.steps} beta={run.beta} seed={run.seed}: loss "
            f"{run.losses[0]:.4f} -> {run.losses[-1]:.4f} in {run.seconds:.1f} s"
        )
    return runs[: len(fixed)], tuning, runs[len(fixed) :]


def _depth_runs(config: Config, cache: UnitCache, log: Log) -> list[DepthRun]:
    """Part (b): one cached unit per (seed, depth, beta), on torch's threads in this process."""
    data = (config.max_length, config.train_examples, config.validation_examples)
    training = dict(
        steps=config.depth_steps, batch_size=config.depth_batch_size, lr=config.depth_lr
    )
    units = [
        Unit(
            {"part": "depth", "depth": int(depth), "beta": float(beta), "seed": int(seed)},
            train_depth_unit,
            (depth, beta, seed, data, training),
        )
        for seed in config.seeds
        for depth in config.depths
        for beta in config.depth_betas
    ]
    runs = [DepthRun(**value) for value in run_units(cache, units, 1, log)]
    minilm.cache_clear()  # the model and data are not held after the part
    sentences.cache_clear()
    for run in runs:
        log(
            f"depth={run.depth} beta={run.beta} seed={run.seed}: final loss {run.losses[-1]:.3f},"
            f" validation error {run.validation_error:.3f} ({run.seconds:.0f} s)"
        )
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
