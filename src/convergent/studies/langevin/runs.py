"""What the ``langevin`` study's units compute: the temperatures, each lam selection (in
:mod:`.selection`) and each (experiment, seed)'s final runs (`final_runs`: phase 1, then every
temperature x variant, and beside each penalty's run at the bound temperature the penalty-only
chain, `null.null_runs`), all built on one phase-2 run (`langevin_run`): Langevin at diffusion
s on loss + lam x penalty over W_Q, W_K (or the LoRA factors),
T <- T - lr * grad V + sqrt(lr * s) * xi, xi ~ N(0, I).

Each job is a top-level function of plain arguments that returns only JSON-ready values (a unit
of the study's cache), so that a process pool can run it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from convergent.data import DictDataset
from convergent.diagnostics import flat_potential, villani_along_ray
from convergent.losses import task_loss
from convergent.models import Transformer
from convergent.optim import Langevin, calibrated_s
from convergent.regularize import (
    Penalty,
    VillaniRegularizer,
    lam_for_stationary_radius,
    radial_relaxation_time,
    stationary_radius,
)
from convergent.studies.langevin.checks import diverged_at
from convergent.studies.langevin.models import (
    DarcyData,
    phase2_model,
    pretrained_model,
    scores,
    targeted,
)
from convergent.studies.langevin.null import null_runs
from convergent.train import RegularizedStep, fit

EXPERIMENTS = ("attention", "lora")
RMSES = ("train_rmse", "validation_rmse", "test_rmse")


def gradient_rms(parameters: Iterable[torch.Tensor]) -> float:
    """sqrt(mean of grad^2) over every entry of the parameters that have a gradient."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    count = sum(g.numel() for g in grads)
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads) / count) if count else 0.0


class _Tracker:
    """A `fit` callback: every `every` steps, each targeted matrix's norm, the three RMSEs and
    the gradient RMS of the step just taken (the noise check's denominator)."""

    def __init__(
        self, model: nn.Module, regularizer: VillaniRegularizer, data: DarcyData, every: int
    ):
        self.model, self.regularizer, self.data, self.every = model, regularizer, data, every
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.records: list[dict[str, Any]] = []
        self.last_step = 0
        self.record(0, None)  # before any step there is no gradient

    def record(self, step: int, grad_rms: float | None, diverged: bool = False) -> None:
        """One evaluation; for a run whose loss or gradient turned non-finite at ``step``, a
        last record of NaNs marked ``diverged`` (every measure of it reads NaN, every claim that
        reads it fails its divergence check, and the study goes on)."""
        norms = self.regularizer.norms()
        measured = {key: math.nan for key in RMSES} if diverged else scores(self.model, self.data)
        self.records.append(
            {
                "step": step,
                "norms": {name: math.nan for name in norms} if diverged else norms,
                **{key: measured[key] for key in RMSES},
                "gap": measured["test_rmse"] - measured["train_rmse"],
                "grad_rms": grad_rms,
                **({"diverged": True} if diverged else {}),
            }
        )

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        self.last_step = step
        if step % self.every == 0:
            # `fit` zeroes gradients at the start of the next step: they are still this step's
            # (loss + regularizer on the batch), exactly what the Langevin step used.
            self.record(step, gradient_rms(self.trainable))


def radius_lam(
    kind: Penalty, weights: list[torch.Tensor], factor: float, s: float, eps: float
) -> float:
    """lam of the radius rule: the penalty alone (flat loss) at diffusion ``s`` puts the mode
    of each ||W||_F at ``factor`` x the root-mean-square start norm of the matrices (all-zero
    ones, like LoRA's B, left out of the norm); averaged over the matrices."""
    squared = [float(w.detach().pow(2).sum()) for w in weights]
    nonzero = [value for value in squared if value > 0]
    radius = factor * math.sqrt(sum(nonzero) / len(nonzero))
    lams = [lam_for_stationary_radius(kind, radius, w.numel(), s, eps) for w in weights]
    return sum(lams) / len(lams)


def theory(
    kind: Penalty, lam: float, numel: dict[str, int], s: float, lr: float, eps: float
) -> tuple[dict[str, float], float]:
    """(stationary radius per matrix, the longest radial relaxation time in steps); inf and
    NaN where there is no penalty or no noise."""
    if lam <= 0 or s <= 0:
        return {name: math.inf for name in numel}, math.nan
    radii = {name: stationary_radius(kind, lam, n, s, eps) for name, n in numel.items()}
    longest = max(radial_relaxation_time(kind, lam, n, s, eps) for n in numel.values())
    return radii, longest / lr


def langevin_run(
    experiment: str,
    base: Transformer,
    data: DarcyData,
    *,
    kind: Penalty,
    lam: float,
    s: float,
    steps: int,
    settings: dict[str, Any],
    seed: int,
) -> tuple[nn.Module, VillaniRegularizer, list[dict[str, Any]]]:
    """Phase 2: only W_Q, W_K (or the LoRA factors) move, by Langevin at diffusion ``s`` on
    loss + lam x penalty. Returns the model, its regularizer and the trace."""
    model = phase2_model(experiment, base, int(settings["lora_rank"]), seed)
    regularizer = targeted(experiment, model, kind, float(settings["power_eps"]))
    regularizer.lam = lam
    tracker = _Tracker(model, regularizer, data, int(settings["record_every"]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        fit(
            model,
            Langevin(trainable, lr=float(settings["langevin_lr"]), s=s, seed=seed),
            data.train,
            max_steps=steps,
            batch_size=min(int(settings["langevin_batch_size"]), len(data.train)),
            task="regression",
            training_step=RegularizedStep("regression", regularizer),
            seed=seed,
            callbacks=[tracker],
            progress=False,
            tensorboard=False,
        )
    except FloatingPointError:  # TrainingDiverged (the loss) or a non-finite gradient
        tracker.record(tracker.last_step + 1, None, diverged=True)
    return model, regularizer, tracker.records


def villani_rows(
    model: nn.Module,
    regularizer: VillaniRegularizer,
    train: DictDataset,
    settings: dict[str, Any],
    s: float,
    seed: int,
) -> list[dict[str, float]]:
    """The Villani quantity along the ray through the current targeted weights, at the
    config's ``villani_radii`` x their norm, with ``villani_probes`` and ``villani_examples``."""
    targets = {name: p for name, p in model.named_parameters() if name in regularizer.parameters}
    examples, radii = int(settings["villani_examples"]), tuple(settings["villani_radii"])
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
    radii_scaled = [r * scale for r in radii]
    probes = int(settings["villani_probes"])
    return villani_along_ray(potential, point, radii_scaled, s, probes=probes, generator=generator)


def temperatures(settings: dict[str, Any], data: DarcyData, d_model: int) -> dict[str, Any]:
    """The s of every temperature level, from the selection seed's phase-1 fit."""
    model = pretrained_model("attention", data, d_model, settings, settings["selection_seed"])
    fitted = scores(model, data)
    examples = len(data.train)
    outputs = int(data.train.tensors["labels"][0].numel())
    calibrated = calibrated_s(fitted["train_mse"], examples, outputs)
    levels = {
        "hot": 2.0 / examples,
        "warm": math.sqrt(2.0 / examples * calibrated),
        "calibrated": calibrated,
        "cold": calibrated / float(settings["cold_factor"]),
        "zero": 0.0,
    }
    return {
        "s": {name: levels[name] for name in settings["temperatures"]},
        "noise_variance": fitted["train_mse"],
        "examples": examples,
        "outputs": outputs,
        "fit": fitted,
    }


def _start_weights(experiment: str, base: Any, settings: dict, seed: int) -> dict[str, Any]:
    """The phase-2 matrices at the start of phase 2 (LoRA's A as PEFT draws it for ``seed``)."""
    model = phase2_model(experiment, base, int(settings["lora_rank"]), seed)
    return targeted(experiment, model, "log", float(settings["power_eps"])).weights()


def start_lam(
    experiment: str,
    base: Any,
    kind: Penalty,
    factor: float,
    s_hot: float,
    settings: dict,
    seed: int,
) -> float:
    """The radius rule's lam for the start weights of ``base``'s phase-2 matrices."""
    weights = list(_start_weights(experiment, base, settings, seed).values())
    return radius_lam(kind, weights, factor, s_hot, float(settings["power_eps"]))


def bound_steps(lams: dict[Penalty, float], numel: dict[str, int], s: float, settings: dict) -> int:
    """Steps for the bound temperature: relaxation_multiple x the slowest relaxation time of
    any penalty's matrices, a multiple of record_every, within [langevin_steps, max]."""
    every = int(settings["record_every"])
    longest = 0.0
    for kind, lam in lams.items():
        _, relaxation = theory(
            kind, lam, numel, s, float(settings["langevin_lr"]), float(settings["power_eps"])
        )
        if math.isfinite(relaxation):
            longest = max(longest, relaxation)
    wanted = math.ceil(float(settings["relaxation_multiple"]) * longest / every) * every
    return int(
        min(max(wanted, int(settings["langevin_steps"])), int(settings["max_langevin_steps"]))
    )


def final_runs(
    experiment: str,
    seed: int,
    settings: dict[str, Any],
    data: DarcyData,
    d_model: int,
    s: dict[str, float],
    factors: dict[Penalty, float],
) -> dict[str, Any]:
    """Phase 1 for ``seed``, then phase 2 at every temperature for every variant."""
    base = pretrained_model(experiment, data, d_model, settings, seed)
    eps, lr = float(settings["power_eps"]), float(settings["langevin_lr"])
    lams = {
        kind: start_lam(experiment, base, kind, factors[kind], s["hot"], settings, seed)
        for kind in factors
    }
    start = _start_weights(experiment, base, settings, seed)
    numel = {name: int(weight.numel()) for name, weight in start.items()}
    out: dict[str, Any] = {
        "seed": seed,
        "pretrained": scores(base, data),
        "phase2": {},
        "villani": {},
    }
    for temperature, diffusion in s.items():
        steps = int(settings["langevin_steps"])
        if temperature == settings["bound_temperature"]:
            steps = bound_steps(lams, numel, diffusion, settings)
        runs: dict[str, Any] = {}
        for variant in settings["variants"]:
            kind: Penalty = "power" if variant == "power" else "log"
            lam = 0.0 if variant == "none" else lams[variant]
            model, regularizer, trace = langevin_run(
                experiment,
                base,
                data,
                kind=kind,
                lam=lam,
                s=diffusion,
                steps=steps,
                settings=settings,
                seed=seed,
            )
            radii, relaxation = theory(kind, lam, numel, diffusion, lr, eps)
            runs[variant] = {
                "lam": lam,
                "steps": steps,
                "relaxation_steps": relaxation,
                "stationary_radius": radii,
                "numel": numel,
                "trace": trace,
            }
            bound = temperature == settings["bound_temperature"]
            if experiment == "attention" and bound and diverged_at(runs[variant]) is None:
                villani = villani_rows(model, regularizer, data.train, settings, diffusion, seed)
                out["villani"][variant] = villani
        out["phase2"][temperature] = runs
    bound = str(settings["bound_temperature"])
    out["null"] = null_runs(out["phase2"][bound], s[bound], settings, seed)
    return out
