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

import math
import multiprocessing
import os
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.data import load_splits, to_patches
from convergent.data.splits import DictDataset
from convergent.losses import task_loss
from convergent.models import Transformer, TransformerConfig
from convergent.models.lora import add_query_key_lora
from convergent.optim.langevin import Langevin
from convergent.regularize import (
    Penalty,
    RegularizedStep,
    VillaniRegularizer,
    flat_potential,
    lam_for_stationary_radius,
    penalty,
    stationary_radius,
    villani_along_ray,
)
from convergent.studies.common import StudyResult, check_mode, json_ready
from convergent.studies.langevin_claims import claims_from_results
from convergent.studies.langevin_report import plot_traces, run_notes, tables_and_summary
from convergent.studies.units import UnitCache
from convergent.train import evaluate, fit

VARIANTS = ("none", "log", "power")


@dataclass(frozen=True)
class Config:
    """Every choice of the study (sizes per mode in `for_mode`).

    Attributes:
        mode: "smoke", "quick" or "full".
        seeds: one run per seed (model init, data order, noise).
        train_examples: use the first this many training examples (None: all 900).
        d_model: width of the Transformer (one head, so the head width too).
        pretrain_steps, pretrain_lr, pretrain_batch_size: phase 1 (AdamW, every parameter).
        langevin_steps, langevin_lr, langevin_batch_size: phase 2 (W_Q, W_K or LoRA factors).
        s: the Langevin diffusion coefficient (temperature s / 2); None means 2 / N_train, the
            posterior at temperature 1 for the loss summed over the training set.
        lam_rule: "radius" (default) or "loss_fraction", how lam is set (module docstring).
        radius_factor: for "radius": the penalty's stationary ||W||_F over the start norm.
        penalty_fraction: for "loss_fraction": the penalty at the start of phase 2 over the
            training loss.
        power_eps: the exponent excess of the super-quadratic penalty (||W||^(2 + eps)).
        record_every: evaluation interval in phase 2, in steps.
        lora_layers, lora_rank: the LoRA variant's depth and rank.
        villani_radii: multiples of the final ||(W_Q, W_K)|| along which the Villani
            quantity is estimated; villani_probes Hutchinson probes on villani_examples.
        growth_threshold: a norm "grows" if its linear trend over the second half of phase 2
            adds more than this fraction of its mean, and is "bounded" otherwise.
        gap_threshold: the gap "creeps up" if it rises by more than this fraction of the
            starting test RMSE over phase 2.
        accuracy_tolerance: "about the same accuracy" means final test RMSEs within this
            relative difference.
        workers: processes that run (seed, experiment) jobs in parallel (results do not depend
            on it). They are spawned, so a script that calls `run` with workers > 1 needs the
            usual `if __name__ == "__main__":` guard (the `convergent` command has it).
        threads: torch CPU threads during the run (restored afterwards); the model is so small
            that more threads mostly add synchronization (10x slower on a busy 2-core machine).
    """

    mode: str = "quick"
    seeds: tuple[int, ...] = (0,)
    train_examples: int | None = None
    d_model: int = 16
    pretrain_steps: int = 1500
    pretrain_lr: float = 3e-3
    pretrain_batch_size: int = 64
    langevin_steps: int = 1500
    langevin_lr: float = 1e-2
    langevin_batch_size: int = 128
    s: float | None = None
    lam_rule: str = "radius"
    radius_factor: float = 2.0
    penalty_fraction: float = 0.01
    power_eps: float = 1.0
    record_every: int = 100
    lora_layers: int = 2
    lora_rank: int = 4
    villani_radii: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    villani_probes: int = 4
    villani_examples: int = 128
    growth_threshold: float = 0.05
    gap_threshold: float = 0.01
    accuracy_tolerance: float = 0.05
    threads: int = 1
    workers: int = 1
    variants: tuple[str, ...] = field(default=VARIANTS)

    @classmethod
    def for_mode(cls, mode: str) -> Config:
        """smoke: seconds, for the test suite; quick: one seed, minutes; full: five seeds."""
        check_mode(mode)
        if mode == "smoke":
            return cls(mode=mode, train_examples=96, d_model=8, pretrain_steps=20,
                       langevin_steps=20, langevin_batch_size=32, record_every=10,
                       villani_radii=(1.0, 4.0), villani_probes=1, villani_examples=16)  # fmt: skip
        if mode == "full":
            return cls(mode=mode, seeds=(0, 1, 2, 3, 4), pretrain_steps=2000, langevin_steps=6000,
                       record_every=300, villani_probes=8,
                       workers=min(3, os.cpu_count() or 1))  # fmt: skip
        # Two processes (W_Q/W_K and LoRA) keep one seed under 5 minutes on 2 cores.
        return cls(mode=mode, pretrain_steps=1000, langevin_steps=2000, record_every=100,
                   workers=min(2, os.cpu_count() or 1))  # fmt: skip


def patch_ordered_splits(train_examples: int | None) -> tuple[DictDataset, DictDataset]:
    """darcy-16 with labels as [N, 16 patches, 16 values], in the order of the input patches.

    RMSE and relative L2 error do not depend on the order of the 256 values, so the model's
    per-token outputs ([B, 16, 16]) are compared with the field cut into the same patches.
    """
    splits = load_splits("darcy-16")
    patch = int(splits.info["patch"])
    resolution = int(splits.info["resolution"])

    def reorder(dataset: DictDataset) -> DictDataset:
        labels = dataset.tensors["labels"].view(-1, resolution, resolution)
        return DictDataset(
            {"inputs": dataset.tensors["inputs"], "labels": to_patches(labels, patch)}
        )

    train = reorder(splits.train)
    if train_examples is not None:
        train = train.subset(torch.arange(min(train_examples, len(train))))
    return train, reorder(splits.test)


def build_model(n_layers: int, d_model: int, tokens: int, features: int, seed: int) -> Transformer:
    """The single-head ViT-style regressor: one output of `features` values per patch."""
    torch.manual_seed(seed)
    config = TransformerConfig(task="regression", input_dim=features, num_outputs=features,
                               pooling="token", max_len=tokens, d_model=d_model, n_heads=1,
                               n_layers=n_layers)  # fmt: skip
    return Transformer(config)


def pretrain(
    model: nn.Module, train: DictDataset, steps: int, lr: float, batch_size: int, seed: int
) -> None:
    """Phase 1: every parameter, AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    fit(model, optimizer, train, max_steps=steps, batch_size=batch_size, task="regression",
        seed=seed, progress=False, tensorboard=False)  # fmt: skip


def gradient_rms(parameters: Iterable[torch.Tensor]) -> float:
    """sqrt(mean of grad^2) over every entry of the parameters that have a gradient."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    count = sum(g.numel() for g in grads)
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads) / count) if count else 0.0


class _Tracker:
    """A `fit` callback: every `every` steps, norms, train/test scores and the gradient RMS of
    the step just taken (the noise check's denominator) into `records`."""

    def __init__(
        self, model: nn.Module, norms: Any, train: DictDataset, test: DictDataset, every: int
    ):
        self.model, self.norms, self.train, self.test, self.every = model, norms, train, test, every
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.records: list[dict[str, float | None]] = []
        self.record(0, None)  # before any step there is no gradient

    def record(self, step: int, grad_rms: float | None) -> None:
        train_scores = evaluate(self.model, self.train, "regression")
        test_scores = evaluate(self.model, self.test, "regression")
        self.records.append({"step": step, **self.norms(), "train_rmse": train_scores["rmse"],
                             "test_rmse": test_scores["rmse"],
                             "train_relative_l2": train_scores["relative_l2"],
                             "test_relative_l2": test_scores["relative_l2"],
                             "gap": test_scores["rmse"] - train_scores["rmse"],
                             "grad_rms": grad_rms})  # fmt: skip

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every == 0:
            # `fit` zeroes gradients at the start of the next step: they are still this step's
            # (loss + regularizer on the batch), exactly what the Langevin step used.
            self.record(step, gradient_rms(self.trainable))


def _total_norm(weights: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(w.detach().pow(2).sum()) for w in weights))


def _norm_reader(regularizer: VillaniRegularizer, groups: dict[str, str]) -> Any:
    """norms() -> {group: ||all matched matrices||_F}, with groups {label: name substring}."""

    def read() -> dict[str, float]:
        weights = regularizer.weights()
        return {
            label: _total_norm([w for n, w in weights.items() if key in n])
            for label, key in groups.items()
        }

    return read


def choose_lam(
    kind: Penalty,
    weights: list[torch.Tensor],
    *,
    rule: str,
    s: float,
    eps: float,
    radius_factor: float,
    penalty_fraction: float,
    train_loss: float,
) -> tuple[float, float]:
    """(lam, target radius) for `rule`, from the targeted matrices at the start of phase 2.

    "radius": the penalty alone (flat loss) puts the mode of each ||W||_F at `radius_factor`
    times the root-mean-square start norm of the targeted matrices (all-zero ones, like
    LoRA's B, excluded); lam is averaged over the matrices. "loss_fraction": the penalty at
    the start is `penalty_fraction` of `train_loss` (the radius is then reported as 0).
    """
    if rule == "loss_fraction":
        unit = sum(float(penalty(w.detach(), kind, 1.0, eps)) for w in weights)
        return (penalty_fraction * train_loss / unit if unit > 0 else 0.0), 0.0
    if rule != "radius":
        raise ValueError(f"lam_rule must be 'radius' or 'loss_fraction', got {rule!r}.")
    squared = [float(w.detach().pow(2).sum()) for w in weights]
    nonzero = [value for value in squared if value > 0]
    radius = radius_factor * math.sqrt(sum(nonzero) / len(nonzero))
    lams = [lam_for_stationary_radius(kind, radius, w.numel(), s, eps) for w in weights]
    return sum(lams) / len(lams), radius


def langevin_phase(
    model: nn.Module,
    regularizer: VillaniRegularizer,
    tracker: _Tracker,
    train: DictDataset,
    *,
    steps: int,
    lr: float,
    s: float,
    batch_size: int,
    seed: int,
) -> None:
    """Phase 2: only the trainable parameters (W_Q, W_K or LoRA factors) move, by Langevin."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = Langevin(trainable, lr=lr, s=s, seed=seed)
    fit(model, optimizer, train, max_steps=steps, batch_size=min(batch_size, len(train)),
        task="regression", training_step=RegularizedStep("regression", regularizer), seed=seed,
        callbacks=[tracker], progress=False, tensorboard=False)  # fmt: skip


def villani_rows(model: nn.Module, regularizer: VillaniRegularizer, train: DictDataset,
                 radii: tuple[float, ...], s: float, probes: int, examples: int, seed: int) -> list[dict[str, float]]:  # fmt: skip
    """The Villani quantity along the ray through the current targeted weights."""
    targets = {name: p for name, p in model.named_parameters() if name in regularizer.parameters}
    batch = {key: value[:examples] for key, value in train.tensors.items()}

    def objective(values: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = torch.func.functional_call(
            model, values, kwargs={"inputs": batch["inputs"]}
        ).logits
        return task_loss(logits, batch["labels"], "regression") + regularizer(values)

    potential = flat_potential(objective, {name: p.shape for name, p in targets.items()})
    point = torch.cat([p.detach().flatten() for p in targets.values()])
    scale = float(point.norm())
    generator = torch.Generator().manual_seed(seed)
    return villani_along_ray(
        potential, point, [r * scale for r in radii], s, probes=probes, generator=generator
    )


def _prepare(experiment: str, base: Transformer, config: Config, seed: int) -> nn.Module:
    """A copy of the pre-trained model with only the phase-2 parameters trainable."""
    tokens, features = base.config.max_len, base.config.input_dim or 0
    model = build_model(base.config.n_layers, config.d_model, tokens, features, seed)
    model.load_state_dict(base.state_dict())
    if experiment == "lora":
        torch.manual_seed(seed)  # PEFT draws A at random
        return add_query_key_lora(model, rank=config.lora_rank)  # freezes everything else
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith(("q_proj.weight", "k_proj.weight")))
    return model


def run_experiment(
    experiment: str, config: Config, seed: int, train: DictDataset, test: DictDataset, s: float
) -> dict[str, Any]:
    """Phase 1 once, then phase 2 from the same weights for each variant.

    experiment "attention": one layer, W_Q and W_K train; "lora": `lora_layers` layers, the
    PEFT LoRA factors on q/k train. Returns only numbers, strings, lists and dicts (a unit of
    the cache; `stationary_radius` is inf without a penalty).
    """
    tokens, features = train.tensors["inputs"].shape[1:]
    layers = 1 if experiment == "attention" else config.lora_layers
    base = build_model(layers, config.d_model, tokens, features, seed)
    pretrain(
        base, train, config.pretrain_steps, config.pretrain_lr, config.pretrain_batch_size, seed
    )
    out: dict[str, Any] = {"pretrained_test": evaluate(base, test, "regression"), "traces": {},
                           "lam": {}, "target_radius": {}, "stationary_radius": {}, "villani": {}}  # fmt: skip
    targets = "query_key" if experiment == "attention" else "lora"
    groups = (
        {"query": "q_proj", "key": "k_proj"}
        if experiment == "attention"
        else {"lora_A": ".lora_A.", "lora_B": ".lora_B."}
    )
    train_loss = evaluate(base, train, "regression")["loss"]
    for variant in config.variants:
        model = _prepare(experiment, base, config, seed)
        kind: Penalty = "power" if variant == "power" else "log"
        regularizer = VillaniRegularizer(model, targets, kind, lam=0.0, eps=config.power_eps)
        lam, radius = (
            (0.0, 0.0)
            if variant == "none"
            else choose_lam(
                kind,
                list(regularizer.weights().values()),
                rule=config.lam_rule,
                s=s,
                eps=config.power_eps,
                radius_factor=config.radius_factor,
                penalty_fraction=config.penalty_fraction,
                train_loss=train_loss,
            )
        )
        regularizer.lam = lam
        reader = _norm_reader(regularizer, groups)
        if experiment == "lora":
            products = VillaniRegularizer(model, penalty=kind, lam=0.0, product=True)

            def reader(
                plain: Any = reader, products: VillaniRegularizer = products
            ) -> dict[str, float]:
                return {**plain(), "lora_BA": _total_norm(list(products.weights().values()))}

        tracker = _Tracker(model, reader, train, test, config.record_every)
        langevin_phase(model, regularizer, tracker, train, steps=config.langevin_steps, lr=config.langevin_lr,
                       s=s, batch_size=config.langevin_batch_size, seed=seed)  # fmt: skip
        numel = next(iter(regularizer.weights().values())).numel()
        stationary = float(stationary_radius(kind, lam, numel, s, config.power_eps))  # inf: none
        for key, value in (("traces", tracker.records), ("lam", lam), ("target_radius", radius),
                           ("stationary_radius", stationary)):  # fmt: skip
            out[key][variant] = value
        if experiment == "attention":
            out["villani"][variant] = villani_rows(model, regularizer, train, config.villani_radii, s,
                                                   config.villani_probes, config.villani_examples, seed)  # fmt: skip
    return out


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
    return StudyResult(name="langevin", mode=config.mode, config=replace(config), tables=tables, claims=claims,
                       figures=figures, data=data, notes=notes,
                       seconds=time.perf_counter() - started)  # fmt: skip


__all__ = ["Config", "claims_from_results", "gradient_rms", "run", "run_experiment"]
