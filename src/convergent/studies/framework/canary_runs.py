"""The canary's runs: the library's numerical code on tiny fixed inputs, each yielding named
tensors (`PARTS`), whose exact bytes `canary.numerics_fingerprint` hashes.

- the `Transformer` (token inputs, continuous inputs, a causal language model, the residual
  study's one-block shape: no norm, beta < 1, last-token readout), trained by `train.fit`
  (batches, loss, warm-up, clipping, evaluation) with every optimizer of `optim.OPTIMIZERS`:
  AdamW, SGD, HORST (reference and foreach paths), HAM and seeded Langevin (plain and
  preconditioned), in float64 and, for the paths that branch on the dtype, in float32;
- the training steps: AC/DC and gradual magnitude pruning (`train.MaskedStep`), a Villani
  penalty (`train.RegularizedStep`), descent constraints with their dual updates, hard and
  resilient, and on a language model with sampled tokens and chunked logits
  (`train.descent_step`);
- magnitude masks (global, uniform, 2:4; both top-k routes), Wanda and SparseGPT on one layer
  and block by block (`sparse.prune_one_shot`);
- the Villani penalties and radii (`regularize`), the Villani quantity along a ray, singular
  values and spectra, rank collapse and layer-wise losses (`diagnostics`), HORST's strength and
  move ratio and Langevin's temperature (`optim`);
- the data perturbations (embeddings, texts), random splits and image patches (`data`).

Each run reads no file; `canary.canary_numbers` runs them under one thread and torch's
default dtype, and restores both and the random states afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from convergent import diagnostics, regularize
from convergent.data import (
    DictDataset,
    perturb_texts,
    perturbed_embeddings,
    random_split_indices,
    to_patches,
)
from convergent.models import Transformer, TransformerConfig
from convergent.optim import (
    HORST,
    build_optimizer,
    calibrated_s,
    decay_groups,
    horst_move_ratio,
    horst_strength,
)
from convergent.sparse import (
    ACDCSchedule,
    GradualSchedule,
    MaskSpec,
    hessian,
    input_squared_norms,
    magnitude_masks,
    prune_one_shot,
    sparsegpt_prune,
    wanda_mask,
)
from convergent.train import (
    ErmStep,
    MaskedStep,
    RegularizedStep,
    TrainingStep,
    descent_step,
    fit,
    warmup_schedule,
)

VOCAB, LENGTH, EXAMPLES, CLASSES = 13, 6, 16, 3
FEATURES, OUTPUTS = 3, 2
STEPS, BATCH = 3, 4
# Each optimizer run: its label -> (the optimizer's name, its options). Learning rates, seeds
# and paths only, so that each class's own defaults (betas, eps, strength, ...) are part of
# what is fingerprinted; "horst-alpha" sets the paper's alpha and beta instead.
OPTIMIZER_RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("adamw", {"lr": 1e-2}),
    "sgd": ("sgd", {"lr": 0.1, "momentum": 0.9}),
    "horst-reference": ("horst", {"lr": 1e-2, "implementation": "reference"}),
    "horst-foreach": ("horst", {"lr": 1e-2, "implementation": "foreach"}),
    "horst-alpha": ("horst", {"lr": 1e-2, "alpha": 5.0, "beta": 0.1}),
    "ham": ("ham", {"lr": 1e-2}),
    "langevin": ("langevin", {"lr": 1e-2, "s": 1e-3, "seed": 0}),
    "langevin-rmsprop": ("langevin", {"lr": 1e-2, "s": 1e-3, "seed": 0, "preconditioned": True}),
}
# The Wanda and SparseGPT mask rules the sparsity study's language model prunes with (its config
# reads them from here, so that the canary runs exactly them): its committed numbers were
# measured before the library followed the authors' code (Wanda pruned round(s * in) per row,
# SparseGPT chose its mask per row of each column block and updated in float64 whatever the
# weights' dtype); docs/design.md, "Pruners".
STUDY_PRUNER_OPTIONS: dict[str, dict[str, Any]] = {
    "wanda": {"rounding": "nearest"},
    "sparsegpt": {"per_row": True, "float64_updates": True},
}
# The studies train in float32, and some paths branch on the dtype: these runs repeat in it.
FLOAT32_RUNS = ("horst-foreach", "ham", "langevin")
REGRESSION = {
    "task": "regression",
    "num_outputs": OUTPUTS,
    "vocab_size": None,
    "input_dim": FEATURES,
    "pooling": "mean",
}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _model(seed: int = 0, dtype: torch.dtype = torch.float64, **changes: Any) -> Transformer:
    """A tiny Transformer, initialized from ``seed`` (the global RNG, restored later)."""
    options: dict[str, Any] = {
        "task": "classification",
        "num_outputs": CLASSES,
        "vocab_size": VOCAB,
        "max_len": LENGTH,
        "d_model": 8,
        "n_heads": 2,
        "n_layers": 2,
        "d_ff": 16,
    }
    options.update(changes)
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(**options)).to(dtype)


def _regression(**changes: Any) -> Transformer:
    """A tiny regression Transformer on continuous inputs (mean pooling unless changed)."""
    return _model(**{**REGRESSION, **changes})


def _tokens(seed: int = 1) -> DictDataset:
    generator = _generator(seed)
    return DictDataset(
        {
            "input_ids": torch.randint(0, VOCAB, (EXAMPLES, LENGTH), generator=generator),
            "labels": torch.randint(0, CLASSES, (EXAMPLES,), generator=generator),
        }
    )


def _continuous(seed: int = 2) -> DictDataset:
    generator = _generator(seed)
    inputs = torch.randn(EXAMPLES, LENGTH, FEATURES, generator=generator, dtype=torch.float64)
    return DictDataset({"inputs": inputs, "labels": inputs.sum(dim=1)[:, :OUTPUTS].tanh()})


def _language(seed: int = 3) -> DictDataset:
    ids = torch.randint(0, VOCAB, (EXAMPLES, LENGTH + 1), generator=_generator(seed))
    return DictDataset({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})


def _batch(data: DictDataset, count: int = 8) -> dict[str, Tensor]:
    return {key: value[:count] for key, value in data.tensors.items()}


def _floats(values: list[Any]) -> Tensor:
    """Python floats and 0-d tensors as one float64 vector (never through float32)."""
    return torch.stack([torch.as_tensor(value, dtype=torch.float64) for value in values])


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _weights(model: nn.Module) -> Tensor:
    return torch.cat([parameter.detach().flatten() for parameter in model.parameters()])


def _fit(
    model: nn.Module,
    optimizer: Any,
    data: DictDataset,
    task: str = "classification",
    step: TrainingStep | None = None,
    steps: int = STEPS,
    **options: Any,
) -> Tensor:
    """The weights after ``steps`` steps of `fit`, then the final loss and evaluation."""
    result = fit(
        model,
        optimizer,
        data,
        max_steps=steps,
        batch_size=BATCH,
        task=task,
        training_step=step,
        progress=False,
        tensorboard=False,
        checks=False,
        **options,
    )
    evaluation = list((result.evaluation or {}).values())
    return torch.cat([_weights(model), _floats([result.train_loss, *evaluation])])


def _optimizers() -> Iterator[tuple[str, Tensor]]:
    runs = [(label, torch.float64) for label in OPTIMIZER_RUNS]
    for label, dtype in runs + [(label, torch.float32) for label in FLOAT32_RUNS]:
        name, options = OPTIMIZER_RUNS[label]
        model = _model(dtype=dtype)
        optimizer = build_optimizer(name, decay_groups(model, 0.1), **options)
        tag = f"{label}/{_name(dtype)}"
        yield f"fit/{tag}", _fit(model, optimizer, _tokens())
        if isinstance(optimizer, HORST):
            strengths = [value for row in horst_strength(optimizer) for value in row.values()]
            yield f"strength/{tag}", _floats([*strengths, horst_move_ratio(optimizer)])
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = warmup_schedule(optimizer, STEPS, warmup_steps=1, kind="cosine")
    yield (
        "fit/warmup-clip-eval",
        _fit(model, optimizer, _tokens(), scheduler=scheduler, grad_clip=0.5, eval_data=_tokens(4)),
    )


def _sparse_training() -> Iterator[tuple[str, Tensor]]:
    # AC/DC over 8 steps: D C D C D C D C, one step each; GMP prunes at steps 1, 3 and 5.
    for name, steps, schedule in (
        ("acdc", 8, ACDCSchedule(8)),
        ("gmp", 6, GradualSchedule(0.75, start_step=1, end_step=5, frequency=2)),
    ):
        model = _model()
        optimizer = build_optimizer("horst", model.parameters(), lr=1e-2)
        spec = MaskSpec(distribution="global", include_first=False)
        selection = spec.select(model)
        step = MaskedStep(
            ErmStep("classification"),
            optimizer,
            selection.names,
            sparsity=0.75,
            schedule=schedule,
            spec=spec,
            input_dims=selection.input_dims,
            reset="moments",
        )
        yield f"masked/{name}", _fit(model, optimizer, _tokens(), step=step, steps=steps)


def _regularized() -> Iterator[tuple[str, Tensor]]:
    model = _regression()
    regularizer = regularize.VillaniRegularizer(model, "query_key", penalty="log", lam=0.1)
    optimizer = build_optimizer("langevin", model.parameters(), lr=1e-2, s=1e-3, seed=1)
    step = RegularizedStep("regression", regularizer)
    yield "regularized/langevin", _fit(model, optimizer, _continuous(), "regression", step)
    weight = torch.linspace(-1.0, 2.0, 12, dtype=torch.float64).reshape(3, 4)
    values = [
        regularize.penalty(weight, "log", 0.1),
        regularize.penalty(weight, "power", 0.1, eps=0.5),
        regularize.lam_for_stationary_radius("log", 2.0, 12, 1e-3),
        regularize.lam_for_stationary_radius("power", 2.0, 12, 1e-3, eps=0.5),
        regularize.stationary_radius("log", 0.1, 12, 1e-3),
        regularize.radial_relaxation_time("power", 0.1, 12, 1e-3, eps=0.5),
        calibrated_s(0.04, EXAMPLES, OUTPUTS),
    ]
    yield "regularize", _floats(values)


def _primal_dual() -> Iterator[tuple[str, Tensor]]:
    for name, options in (
        ("hard", {"alpha": 0.1, "dual_lr": 0.5}),
        ("resilient", {"alpha": [0.1, 0.2], "dual_lr": 0.5, "resilient_cost": 2.0}),
    ):
        model = _model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = descent_step("classification", model.num_layers, seed=0, **options)
        weights = _fit(model, optimizer, _tokens(), step=step)
        slack = step.dual.slack()
        dual = [step.dual.value()] + ([] if slack is None else [slack])
        yield f"descent/{name}", torch.cat([weights, *[value.double() for value in dual]])
    model = _model(task="lm", causal=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = descent_step(
        "lm",
        model.num_layers,
        alpha=0.1,
        dual_lr=0.5,
        token_fraction=0.5,
        logit_chunk_tokens=5,
        layers_per_step=1,
        seed=0,
    )
    weights = _fit(model, optimizer, _language(), "lm", step)
    yield "descent/lm-sampled", torch.cat([weights, step.dual.value().double()])


def _masks() -> Iterator[tuple[str, Tensor]]:
    # float64 weights take the sorting top-k route, float32 ones the radix route (global only:
    # its two histograms per tensor would cost the uniform masks 0.4 s).
    for dtype, distribution, pattern in (
        (torch.float64, "global", "unstructured"),
        (torch.float32, "global", "unstructured"),
        (torch.float64, "uniform", "unstructured"),
        (torch.float64, "uniform", "2:4"),
    ):
        model = _model(dtype=dtype)
        spec = MaskSpec(distribution=distribution, pattern=pattern, include_last=True)
        selection = spec.select(model)
        masks = magnitude_masks(model, selection.names, 0.6, spec, selection.input_dims)
        yield (
            f"masks/{distribution}-{pattern}/{_name(dtype)}",
            torch.cat([mask.flatten() for _, mask in masks.items()]),
        )
    generator = _generator(5)
    weight = torch.randn(4, 8, generator=generator, dtype=torch.float64)
    inputs = torch.randn(20, 8, generator=generator, dtype=torch.float64)
    legacy_wanda = STUDY_PRUNER_OPTIONS["wanda"]
    legacy_sparsegpt = STUDY_PRUNER_OPTIONS["sparsegpt"]
    for pattern in ("unstructured", "2:4"):
        yield (
            f"wanda/{pattern}",
            wanda_mask(weight, input_squared_norms(inputs), 0.5, pattern, **legacy_wanda),
        )
        pruned, keep = sparsegpt_prune(
            weight, hessian(inputs), 0.5, pattern, block_size=4, **legacy_sparsegpt
        )
        yield f"sparsegpt/{pattern}", torch.cat([pruned.flatten(), keep.flatten().double()])
    calibration = [_batch(_language(6), 4), _batch(_language(7), 4)]
    for method in ("magnitude", "wanda", "sparsegpt"):
        model = _model(task="lm", causal=True)
        inputs_only = [{"input_ids": batch["input_ids"]} for batch in calibration]
        prune_one_shot(
            model,
            0.5,
            method=method,
            calibration=None if method == "magnitude" else inputs_only,
            options=STUDY_PRUNER_OPTIONS.get(method),
        )
        yield f"one-shot/{method}", _weights(model)


def _diagnostics() -> Iterator[tuple[str, Tensor]]:
    model = _model()
    batch = _batch(_tokens())
    yield "layerwise-losses", diagnostics.layerwise_losses(model, batch).double().detach()
    yield "rank-collapse", diagnostics.layerwise_rank_collapse(model, batch)
    matrices = torch.randn(3, 5, 4, generator=_generator(8), dtype=torch.float64)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1, 3:] = False
    yield "singular-values/gram", diagnostics.singular_values(matrices, "gram")
    yield "singular-values/svd", diagnostics.singular_values(matrices, "svd")
    yield (
        "singular-value-extremes",
        torch.stack(diagnostics.singular_value_extremes(matrices, keep)),
    )
    # The residual study's shape: one block, one head, no norm, beta < 1, last-token readout.
    one_block = _regression(n_heads=1, n_layers=1, beta=0.5, norm="none", pooling="last")
    spectra = diagnostics.attention_spectra(one_block, {"inputs": _batch(_continuous())["inputs"]})
    fields = ("sigma_min", "sigma_max", "residual_sigma_min", "residual_sigma_max")
    yield "attention-spectra", torch.cat([getattr(spectra, f).flatten().double() for f in fields])


def _villani() -> Iterator[tuple[str, Tensor]]:
    regression = _regression()
    regularizer = regularize.VillaniRegularizer(
        regression, "query_key", penalty="power", lam=0.1, eps=0.5
    )
    targets = regularizer.parameters
    data = _batch(_continuous())

    def objective(values: dict[str, Tensor]) -> Tensor:
        output = torch.func.functional_call(regression, values, kwargs={"inputs": data["inputs"]})
        return ((output.logits - data["labels"]) ** 2).mean() + regularizer(values)

    potential = diagnostics.flat_potential(
        objective, {name: p.shape for name, p in targets.items()}
    )
    origin = torch.cat([p.detach().flatten() for p in targets.values()])
    rows = diagnostics.villani_along_ray(
        potential,
        torch.ones_like(origin),
        [0.5, 2.0],
        s=1e-3,
        origin=origin,
        probes=2,
        generator=_generator(9),
    )
    yield "villani", _floats([value for row in rows for value in row.values()])


def _data() -> Iterator[tuple[str, Tensor]]:
    model = _model()
    batch = _batch(_tokens())
    for kind, gamma in (("gaussian", 0.5), ("uniform", 0.5), ("discrete", 0.3)):
        with torch.no_grad(), perturbed_embeddings(model, kind, gamma, seed=10, skip_token_ids=[0]):
            yield f"perturbed/{kind}", model(input_ids=batch["input_ids"]).logits
    text = ["the quick brown fox jumps over the lazy dog", "a second, shorter sentence"]
    for kind in ("typos", "word_dropout"):
        changed = "\n".join(perturb_texts(text, kind, 0.3, seed=11)).encode()
        yield f"texts/{kind}", torch.tensor(list(changed), dtype=torch.uint8)
    yield "splits", torch.cat(random_split_indices(50, seed=12))
    yield "patches", to_patches(torch.arange(2 * 4 * 4, dtype=torch.float64).reshape(2, 4, 4), 2)


PARTS: tuple[Callable[[], Iterator[tuple[str, Tensor]]], ...] = (
    _optimizers,
    _sparse_training,
    _regularized,
    _primal_dual,
    _masks,
    _diagnostics,
    _villani,
    _data,
)
