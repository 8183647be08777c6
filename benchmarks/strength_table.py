"""How far the mirror step moves the weights at the optimizers' defaults, on four real models.

For each model it trains, on the same initialization and data order, for a short run with
`convergent.train.fit` and the param groups of `decay_groups`:

- ``horst``: ``HORST(groups, lr=lr)``, neither alpha nor strength given, so
  ``strength=DEFAULT_STRENGTH``: at each group's first step alpha = 0.2 / mean |theta| of the
  group's mirrored tensors;
- ``ham``: ``HAM(AdamW(groups, lr=lr))`` at HAM's own default, the authors' alpha = 200.
  (A HAM strength set at the first step, alpha = 0.2 mean |base move| / (lr mean |w grad|),
  was measured with this script on 2026-12-04 and is not offered: the ViT diverged at step 5
  and the GPT-2's ratio went from 3.1 to 2e16; see `HAM`.)

It reads the mirror/AdamW move ratio of the next step (`horst_move_ratio`, `ham_move_ratio`)
after step 1 (the first-step ratio: one gradient's moments, so the Adam direction is the first
step's) and every ``steps // readings`` steps. The table gives that first reading, the mean,
min and max over all finite readings (the last step's next lr is 0 under a decaying schedule,
so it has no ratio), alpha after step 1 (HORST's from `horst_strength`; the groups that mirror
something) and the mean |theta| HORST set alpha from (strength / alpha). fit's manipulation
checks are off unless ``--checks`` (they read the same ratio again).

The models, each trained as its source trains it (both HAMs at the same lr):

- ``vit``: the ``sparsity`` study's Fashion-MNIST ViT (its full mode by default: 28x28 images in
  7x7 patches, d_model 128, 4 layers), the study's batch, weight decay, 5 % warm-up and cosine
  decay; lr 5e-4 for HORST and 1e-3 for HAM (design 3's validation selections,
  docs/results/sparsity-full/results.json; design 2's d_model-16 ViT selected 0.01 and 0.03).
- ``lm``: the study's Austen character LM (full mode: d_model 128, 2 layers, windows of 64),
  batch 32, weight decay 0.05, grad clip 1, the same schedule; lr 0.001 for both (HORST's
  selection; the study runs no HAM on the LM).
- ``minilm``: MiniLM-L6 fine-tuned on rt-sentences (max_length 48) as ``convergent train``
  builds it (mean pooling, sdpa attention), batch 32, lr 5e-5, weight decay 0.01, grad clip 1,
  10 % warm-up and linear decay.
- ``gpt2``: the GPT-2 of examples/gpt2_austen.py (built from a config: 128 wide, 4 layers,
  MiniLM's vocabulary; Austen windows tokenized to 64), with that example's Trainer settings:
  batch 16, lr 1e-3, weight decay 0, grad clip 1, 10 % warm-up and linear decay. Its loss is
  the model's own (Hugging Face shifts the labels).

Run: python benchmarks/strength_table.py [--models vit lm minilm gpt2] [--optimizers horst ham]
     [--steps N] [--model-steps minilm=100] [--readings 10] [--study-mode full]
     [--threads 2] [--checks] [--verbose]
The default steps (vit 300, lm 300, minilm 25, gpt2 30) took 29 minutes on 2 cores shared
with another job (about one core free): MiniLM and the GPT-2 (its 30,522-word output layer)
take seconds per step there, and a MiniLM reading seconds more. ``--optimizers horst ham`` or
fewer ``--models`` cut it.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.data import load_splits, minilm_path
from convergent.models import HFEncoder
from convergent.optim import (
    DEFAULT_STRENGTH,
    HAM,
    HORST,
    build_optimizer,
    decay_groups,
    ham_move_ratio,
    horst_move_ratio,
    horst_strength,
)
from convergent.studies.sparsity import Config, language_model, subset, vision_model
from convergent.train import TrainingDiverged, fit, seed_everything, warmup_schedule

# name: (label, build_optimizer name, options beyond lr)
OPTIMIZERS: dict[str, tuple[str, str, dict[str, float]]] = {
    "horst": ("HORST()", "horst", {}),
    "ham": ("HAM(AdamW())", "ham", {}),
}
DEFAULT_READINGS = 10
GPT2_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gpt2_austen.py"


@dataclass
class Setup:
    """One model, its data and how its source trains it."""

    label: str
    model: nn.Module
    train_data: Any
    task: str
    lrs: dict[str, float]
    weight_decay: float
    batch_size: int
    steps: int
    schedule: str
    warmup_fraction: float
    grad_clip: float | None
    training_step: Any = None


class ModelLoss:
    """A training step whose loss is the model's own (a Hugging Face model given ``labels``)."""

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, dict]:
        value = model(**batch).loss
        return value, {"loss": float(value.detach())}

    def after_optimizer_step(self, model: nn.Module) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass
class RatioReader:
    """Reads the move ratio after step 1 and every ``every`` steps (a `fit` callback)."""

    optimizer: torch.optim.Optimizer
    every: int
    readings: list[tuple[int, float]] = field(default_factory=list)
    alphas: list[float] = field(default_factory=list)
    mean_abs: list[float] = field(default_factory=list)

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        if step == 1:
            self.alphas, self.mean_abs = first_step_alphas(self.optimizer)
        if step == 1 or step % self.every == 0:
            if isinstance(self.optimizer, HAM):
                ratio = ham_move_ratio(self.optimizer)
            else:
                assert isinstance(self.optimizer, HORST)
                ratio = horst_move_ratio(self.optimizer)
            self.readings.append((step, ratio))


def first_step_alphas(optimizer: torch.optim.Optimizer) -> tuple[list[float], list[float]]:
    """After step 1: alpha of each group that mirrors something (as set from the strength, or
    given) and, for HORST, the mean |theta| it was set from (strength / alpha: the weights
    before step 1)."""
    if isinstance(optimizer, HORST):
        rows = [row for row in horst_strength(optimizer) if row["mirrored"] > 0]
        return [row["alpha"] for row in rows], [row["strength"] / row["alpha"] for row in rows]
    alphas = [
        math.nan if group["ham_alpha"] is None else float(group["ham_alpha"])
        for group in optimizer.param_groups
        if group_mirrors(group, "ham_mirror")
    ]
    return alphas, []


def group_mirrors(group: dict[str, Any], key: str) -> bool:
    flag = group.get(key)
    return any((p.ndim >= 2) if flag is None else bool(flag) for p in group["params"])


def vit_setup(config: Config, steps: int) -> Setup:
    splits = load_splits("fashion-mnist", seed=0, size=config.image_size, patch=config.patch)
    model = vision_model(
        splits,
        d_model=config.vit_d_model,
        n_layers=config.vit_layers,
        n_heads=config.vit_heads,
        d_ff=config.vit_d_ff,
    )
    return Setup(
        label="ViT",
        model=model,
        train_data=subset(splits.train, config.train_examples),
        task="classification",
        lrs={"horst": 5e-4, "ham": 1e-3},
        weight_decay=config.weight_decay,
        batch_size=config.vit_batch_size,
        steps=steps,
        schedule="cosine",
        warmup_fraction=0.05,
        grad_clip=None,
    )


def lm_setup(config: Config, steps: int) -> Setup:
    splits = load_splits("austen", seq_len=config.lm_seq_len)
    assert splits.vocab_size is not None
    model = language_model(
        splits.vocab_size,
        splits.seq_len,
        d_model=config.lm_d_model,
        n_layers=config.lm_layers,
        n_heads=config.lm_heads,
        d_ff=config.lm_d_ff,
    )
    return Setup(
        label="char LM",
        model=model,
        train_data=splits.train,
        task="lm",
        lrs={"horst": 1e-3, "ham": 1e-3},
        weight_decay=config.weight_decay,
        batch_size=config.lm_batch_size,
        steps=steps,
        schedule="cosine",
        warmup_fraction=0.05,
        grad_clip=1.0,
    )


def minilm_setup(config: Config, steps: int) -> Setup:
    splits = load_splits("rt-sentences", seed=0, max_length=48)
    model = HFEncoder.from_pretrained(
        minilm_path(),
        task=splits.task,
        num_outputs=splits.num_outputs,
        pooling="mean",
        attn_implementation="sdpa",
    )
    return Setup(
        label="MiniLM fine-tuning",
        model=model,
        train_data=splits.train,
        task=splits.task,
        lrs={"horst": 5e-5, "ham": 5e-5},
        weight_decay=0.01,
        batch_size=32,
        steps=steps,
        schedule="linear",
        warmup_fraction=0.1,
        grad_clip=1.0,
    )


def gpt2_setup(config: Config, steps: int) -> Setup:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    spec = importlib.util.spec_from_file_location("gpt2_austen", GPT2_EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    max_length = 64  # the example's default
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    gpt2_config = GPT2Config(  # as the example's main() builds it
        vocab_size=tokenizer.vocab_size,
        n_positions=max_length,
        n_embd=128,
        n_layer=4,
        n_head=4,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(gpt2_config)
    return Setup(
        label="GPT-2 from a config",
        model=model,
        train_data=example.austen_windows(tokenizer, max_length),
        task="lm",
        lrs={"horst": 1e-3, "ham": 1e-3},
        weight_decay=0.0,
        batch_size=16,
        steps=steps,
        schedule="linear",
        warmup_fraction=0.1,
        grad_clip=1.0,
        training_step=ModelLoss(),
    )


SETUPS: dict[str, tuple[Callable[[Config, int], Setup], int]] = {
    "vit": (vit_setup, 300),
    "lm": (lm_setup, 300),
    "minilm": (minilm_setup, 25),
    "gpt2": (gpt2_setup, 30),
}


def mirrored_elements(optimizer: torch.optim.Optimizer) -> int:
    """Elements the mirror step acts on (tensors with ndim >= 2, the default of both)."""
    key = "mirror" if isinstance(optimizer, HORST) else "ham_mirror"
    count = 0
    for group in optimizer.param_groups:
        flag = group.get(key)
        for param in group["params"]:
            if (param.ndim >= 2) if flag is None else bool(flag):
                count += param.numel()
    return count


def run(name: str, choice: str, config: Config, steps: int, args: Any) -> dict[str, Any]:
    """One short training run of optimizer ``choice`` on model ``name``; its table row."""
    build, _ = SETUPS[name]
    label, optimizer_name, options = OPTIMIZERS[choice]
    seed_everything(args.seed)
    setup = build(config, steps)
    lr = setup.lrs[optimizer_name]
    groups = decay_groups(setup.model, setup.weight_decay)
    optimizer = build_optimizer(optimizer_name, groups, lr=lr, **options)
    scheduler = warmup_schedule(
        optimizer,
        total_steps=steps,
        warmup_steps=max(1, round(setup.warmup_fraction * steps)),
        kind=setup.schedule,
    )
    reader = RatioReader(optimizer, max(1, steps // args.readings))
    started = time.perf_counter()
    diverged = None
    result = None
    try:
        result = fit(
            setup.model,
            optimizer,
            setup.train_data,
            max_steps=steps,
            batch_size=setup.batch_size,
            task=setup.task,
            training_step=setup.training_step,
            scheduler=scheduler,
            grad_clip=setup.grad_clip,
            seed=args.seed,
            callbacks=[reader],
            progress=False,
            tensorboard=False,
            log_every=steps,
            checks=args.checks,
        )
    except TrainingDiverged as error:
        diverged = str(error)
    finite = [ratio for _, ratio in reader.readings if math.isfinite(ratio)]
    return {
        "model": setup.label,
        "optimizer": label,
        "lr": lr,
        "steps": steps,
        "mirrored": mirrored_elements(optimizer),
        "alphas": reader.alphas,
        "mean_abs": reader.mean_abs,
        "first": reader.readings[0][1] if reader.readings else math.nan,
        "mean": sum(finite) / len(finite) if finite else math.nan,
        "min": min(finite) if finite else math.nan,
        "max": max(finite) if finite else math.nan,
        "readings": reader.readings,
        "finite": len(finite),
        "loss": result.train_loss if result else math.nan,
        "seconds": time.perf_counter() - started,
        "diverged": diverged,
        "warnings": result.warnings if result else [],
    }


def numbers(values: list[float]) -> str:
    return ", ".join(f"{value:.3g}" for value in values) or "-"


def table(rows: list[dict[str, Any]]) -> str:
    columns = (
        "model",
        "optimizer",
        "lr",
        "steps",
        "params mirrored",
        "alpha (after step 1)",
        "HORST mean abs(theta)",
        "first-step ratio",
        "mean ratio",
        "min",
        "max",
        "readings",
        "final loss",
    )
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = (
            row["model"],
            row["optimizer"],
            f"{row['lr']:g}",
            str(row["steps"]),
            f"{row['mirrored'] / 1e6:.2f} M",
            numbers(row["alphas"]),
            numbers(row["mean_abs"]),
            f"{row['first']:.3g}",
            f"{row['mean']:.3g}",
            f"{row['min']:.3g}",
            f"{row['max']:.3g}",
            f"{row['finite']}/{len(row['readings'])}",
            "diverged" if row["diverged"] else f"{row['loss']:.3f}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def revision() -> str:
    """The repository's commit, with "+changes" when the working tree differs from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "(no git)"
    return (commit or "(unknown commit)") + ("+changes" if dirty else "")


def parse_model_steps(values: list[str]) -> dict[str, int]:
    steps = {}
    for value in values:
        name, _, count = value.partition("=")
        if name not in SETUPS or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--model-steps takes MODEL=N with MODEL in {list(SETUPS)}: {value!r}")
        steps[name] = int(count)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    parser.add_argument(
        "--optimizers",
        nargs="+",
        choices=list(OPTIMIZERS),
        default=list(OPTIMIZERS),
        help="horst: HORST() at its default strength; ham: HAM(AdamW()) at its default alpha",
    )
    parser.add_argument("--steps", type=int, help="steps of every run (default: per model)")
    parser.add_argument(
        "--model-steps",
        nargs="*",
        default=[],
        metavar="MODEL=N",
        help="steps of one model's runs; defaults: "
        + ", ".join(f"{name}={steps}" for name, (_, steps) in SETUPS.items()),
    )
    parser.add_argument(
        "--readings", type=int, default=DEFAULT_READINGS, help="ratio readings per run"
    )
    parser.add_argument(
        "--study-mode", choices=("quick", "full"), default="full", help="the ViT's and LM's shape"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--checks", action="store_true", help="also run fit's manipulation checks (slower)"
    )
    parser.add_argument("--verbose", action="store_true", help="print every reading")
    args = parser.parse_args()
    if args.readings < 1 or (args.steps is not None and args.steps < 1):
        raise SystemExit("--readings and --steps must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    config = Config.for_mode(args.study_mode)
    overrides = parse_model_steps(args.model_steps)
    rows = []
    started = time.perf_counter()
    for name in args.models:
        steps = overrides.get(name, args.steps or SETUPS[name][1])
        for choice in args.optimizers:
            row = run(name, choice, config, steps, args)
            rows.append(row)
            print(
                f"{row['model']}, {row['optimizer']}: {row['seconds']:.0f} s, first ratio "
                f"{row['first']:.3g}, mean {row['mean']:.3g}"
                + (f" ({row['diverged']})" if row["diverged"] else ""),
                file=sys.stderr,
                flush=True,
            )
    print(
        f"\nMirror/AdamW move ratio at the optimizers' defaults (HORST: strength "
        f"{DEFAULT_STRENGTH}), study mode {args.study_mode}, seed {args.seed}, "
        f"convergent {revision()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{time.perf_counter() - started:.0f} s in all\n"
    )
    print(table(rows))
    print()
    for row in rows:
        notes = [f"{row['seconds']:.0f} s"]
        if row["diverged"]:
            notes.append(row["diverged"])
        notes += [f"warning: {w.get('message', w)}" for w in row["warnings"]]
        print(f"{row['model']}, {row['optimizer']}: " + "; ".join(notes))
        if args.verbose:
            readings = ", ".join(f"{step}: {ratio:.3g}" for step, ratio in row["readings"])
            print(f"  readings (step: ratio): {readings}")


if __name__ == "__main__":
    main()
