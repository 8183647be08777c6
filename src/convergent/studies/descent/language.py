"""Part (c) of the ``descent`` study: the paper's language-model claim at a size a CPU runs.

The paper fine-tunes Llama 3.1 8B with and without layer-wise descent constraints and lets
AlpacaEval judge the pairs: a 50 % win rate without noise, 69.93 % under Gaussian embedding
noise at gamma 1.5. Here a GPT-style decoder (``models.language_model``) reads MiniLM's
WordPiece tokens of 256-character windows of Jane Austen's novels. Each novel's training
block is cut by position: the first two thirds pretrain one shared checkpoint
(:func:`pretrain_unit`, until validation perplexity flattens: :func:`flattened`), the last
third is held apart for the fine-tunes (:func:`language_unit`), which all start from that
checkpoint and differ, within a seed, by the training step alone.
The judgement is per test window: the constrained model wins a window where its loss is lower
than ERM's (:func:`~convergent.studies.descent.measures.sequence_wins`).

The vocabulary is the WordPiece tokens of the training windows (and the tokenizer's special
tokens); a validation or test token outside it reads as [UNK]. A window's truncation marker
[SEP] is no word of the text and is never a target. Grid runs read the validation windows only;
the test windows are read through :func:`language_test_data`, by final runs alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from convergent.data import DictDataset, load_splits, minilm_path, perturbed_embeddings, tokenize
from convergent.losses import IGNORE_INDEX, next_token_labels
from convergent.studies.descent.config import Config, LanguageConfig
from convergent.studies.descent.measures import (
    layer_report,
    sequence_losses,
)
from convergent.studies.descent.models import language_model, train_model
from convergent.studies.descent.runs import LAYER_SCORES, diverged_record, training_fields
from convergent.studies.engine import Unit, training_key
from convergent.studies.framework import tensors_digest
from convergent.train import evaluate, fit, warmup_schedule

CHARACTERS_PER_WINDOW = 256  # about 62 WordPiece tokens of the novels' prose
FINETUNE_SHARE = 1 / 3  # the last third of each novel's training block: the fine-tuning text
PRETRAIN_MONITOR = 256  # validation windows behind the pretraining's stopping rule
FLAT_GAIN = 0.02  # stop pretraining once perplexity gains less than this ...
FLAT_EVALUATIONS = 2  # ... over this many evaluations
TRAIN_PROBE = 256  # fine-tuning windows scored for "constraints satisfied on train"
EVALUATION_BATCH = 64  # windows per scoring pass (logits of 64 x 64 tokens x the vocabulary)
SELECTION_NOISE_SEED = 5500
TEST_NOISE_SEED = 6000
DECIMALS = 6  # per-sequence losses kept to 1e-6 nats (float32 holds no more)

SELECTION_SCORES = ("validation_perplexity", "validation_noisy_perplexity", *LAYER_SCORES)
FINAL_SCORES = ("perplexity", *LAYER_SCORES)


@functools.lru_cache(maxsize=1)
def _austen() -> Any:
    return load_splits("austen", seed=0, seq_len=CHARACTERS_PER_WINDOW)


def _texts(rows: torch.Tensor) -> list[str]:
    itos = _austen().info["itos"]
    return ["".join(itos[i] for i in row) for row in rows.tolist()]


def spaced(indices: torch.Tensor, count: int | None) -> torch.Tensor:
    """``count`` of ``indices``, evenly spaced from the first (all of them for None or more),
    so that a subset spans every novel rather than the start of the first."""
    if count is None or count >= len(indices):
        return indices
    return indices[torch.arange(count) * len(indices) // count]


def training_portions() -> tuple[torch.Tensor, torch.Tensor]:
    """The training windows that pretrain and those held apart for fine-tuning: of each
    novel's windows, in the order of the text, the first two thirds and the rest."""
    novels = _austen().info["window_starts"]["train"][:, 0]
    pretrain, finetune = [], []
    for novel in novels.unique().tolist():
        rows = (novels == novel).nonzero().reshape(-1)
        cut = round(len(rows) * (1 - FINETUNE_SHARE))
        pretrain.append(rows[:cut])
        finetune.append(rows[cut:])
    return torch.cat(pretrain), torch.cat(finetune)


@dataclass(frozen=True)
class LanguageData:
    """The tokenized training portions and what every other split is encoded with.

    Attributes:
        pretrain, finetune: the two training portions as next-token datasets.
        lookup: WordPiece id -> the model's token id ([UNK]'s for a token outside the vocabulary).
        special_ids: the model ids of the tokenizer's special tokens (never perturbed).
        tokenizer: MiniLM's WordPiece tokenizer.
        max_length: tokens kept of each window.
    """

    pretrain: DictDataset
    finetune: DictDataset
    lookup: torch.Tensor
    special_ids: tuple[int, ...]
    tokenizer: Any
    max_length: int

    @property
    def vocab_size(self) -> int:
        return int(self.lookup.max()) + 1

    def encode(self, texts: Sequence[str]) -> DictDataset:
        """Windows of text as a next-token dataset in the model's ids."""
        return _encoded(
            tokenize(texts, self.tokenizer, self.max_length), self.lookup, self.tokenizer
        )


def _encoded(
    encoded: Mapping[str, torch.Tensor], lookup: torch.Tensor, tokenizer: Any
) -> DictDataset:
    ids, mask = lookup[encoded["input_ids"]], encoded["attention_mask"]
    labels = next_token_labels(ids, mask)
    labels = labels.masked_fill(labels == int(lookup[tokenizer.sep_token_id]), IGNORE_INDEX)
    return DictDataset({"input_ids": ids, "attention_mask": mask, "labels": labels})


@functools.lru_cache(maxsize=2)
def language_data(max_length: int, pretrain: int | None, finetune: int | None) -> LanguageData:
    """The two training portions (each cut to that many evenly spaced windows), loaded once
    per process; the vocabulary is built from them alone."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    windows = _austen().train.tensors["input_ids"]
    first, second = (
        spaced(rows, count)
        for rows, count in zip(training_portions(), (pretrain, finetune), strict=True)
    )
    encoded = [tokenize(_texts(windows[rows]), tokenizer, max_length) for rows in (first, second)]
    seen = torch.cat([e["input_ids"][e["attention_mask"] == 1] for e in encoded])
    kept = torch.unique(torch.cat([seen, torch.tensor(tokenizer.all_special_ids)]))
    unknown = int(torch.searchsorted(kept, tokenizer.unk_token_id))
    lookup = torch.full((len(tokenizer),), unknown, dtype=torch.long)
    lookup[kept] = torch.arange(len(kept))
    return LanguageData(
        pretrain=_encoded(encoded[0], lookup, tokenizer),
        finetune=_encoded(encoded[1], lookup, tokenizer),
        lookup=lookup,
        special_ids=tuple(int(lookup[i]) for i in tokenizer.all_special_ids),
        tokenizer=tokenizer,
        max_length=max_length,
    )


@functools.lru_cache(maxsize=4)
def language_windows(
    split: str, max_length: int, pretrain: int | None, finetune: int | None, count: int | None
) -> DictDataset:
    """``count`` evenly spaced windows of ``split`` (``"validation"`` or ``"test"``), encoded
    with the vocabulary of :func:`language_data`."""
    if split not in ("validation", "test"):
        raise ValueError(f"split must be 'validation' or 'test', got {split!r}")
    rows = getattr(_austen(), split).tensors["input_ids"]
    data = language_data(max_length, pretrain, finetune)
    return data.encode(_texts(rows[spaced(torch.arange(len(rows)), count)]))


def training_data(spec: LanguageConfig) -> LanguageData:
    return language_data(spec.max_length, spec.pretrain_windows, spec.finetune_windows)


def validation_data(spec: LanguageConfig) -> DictDataset:
    """The validation windows: all that selection, pretraining and the pilot read."""
    return language_windows(
        "validation",
        spec.max_length,
        spec.pretrain_windows,
        spec.finetune_windows,
        spec.validation_windows,
    )


def language_test_data(spec: LanguageConfig) -> DictDataset:
    """The test windows, read by final runs only."""
    return language_windows(
        "test", spec.max_length, spec.pretrain_windows, spec.finetune_windows, spec.test_windows
    )


def flattened(perplexities: Sequence[float]) -> bool:
    """The pretraining's stopping rule: the latest validation perplexity is less than
    ``FLAT_GAIN`` (2 %) below the one ``FLAT_EVALUATIONS`` (2) evaluations earlier."""
    if len(perplexities) <= FLAT_EVALUATIONS:
        return False
    return 1 - perplexities[-1] / perplexities[-1 - FLAT_EVALUATIONS] < FLAT_GAIN


def _model(spec: LanguageConfig, seed: int, vocab_size: int) -> torch.nn.Module:
    return language_model(seed, vocab_size, spec.max_length, spec.width, spec.heads, spec.layers)


def pretraining(config: Config) -> Unit:
    """The one pretraining run every fine-tune of ``config`` starts from (:func:`pretrain_unit`)."""
    key = {"part": "language", "method": "pretrain", "seed": config.language.pretrain_seed}
    return Unit(key, pretrain_unit, (config,), config.threads)


def pretrain_unit(config: Config) -> dict[str, Any]:
    """Pretrain on the first portion until :func:`flattened` (or the step cap).

    AdamW at a constant lr after ``evaluate_every`` warm-up steps (the run may stop anywhere,
    so no decay is tied to the cap), clip 1.0, batches from a fresh shuffle (seeded) in each
    stretch of ``evaluate_every`` steps; validation perplexity on :data:`PRETRAIN_MONITOR`
    evenly spaced validation windows after each stretch.

    Returns:
        ``{"state": the weights, "curve": [{"step", "perplexity"}], "stopped": why, "steps",
        "validation_perplexity": on every validation window, "vocab_size"}``.
    """
    spec = config.language
    data = training_data(spec)
    validation = validation_data(spec)
    monitor = validation.subset(spaced(torch.arange(len(validation)), PRETRAIN_MONITOR))
    model = _model(spec, spec.pretrain_seed, data.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.pretrain_lr, weight_decay=0.01)
    warmup = min(spec.evaluate_every, spec.pretrain_steps)
    scheduler = warmup_schedule(optimizer, spec.pretrain_steps, warmup, kind="constant")
    curve: list[dict[str, float]] = []
    stopped = f"step cap ({spec.pretrain_steps})"
    steps = 0
    while steps < spec.pretrain_steps:
        stretch = min(spec.evaluate_every, spec.pretrain_steps - steps)
        fit(
            model,
            optimizer,
            data.pretrain,
            max_steps=stretch,
            batch_size=spec.batch_size,
            task="lm",
            scheduler=scheduler,
            grad_clip=1.0,
            seed=spec.pretrain_seed * 1000 + len(curve),
            progress=False,
            tensorboard=False,
            checks=False,
        )
        steps += stretch
        score = evaluate(model, monitor, "lm", batch_size=EVALUATION_BATCH)["perplexity"]
        curve.append({"step": steps, "perplexity": score})
        if flattened([point["perplexity"] for point in curve]):
            stopped = (
                f"flat: validation perplexity gained less than {100 * FLAT_GAIN:g} % over the "
                f"last {FLAT_EVALUATIONS} evaluations"
            )
            break
    return {
        "state": {key: value.detach().clone() for key, value in model.state_dict().items()},
        "curve": curve,
        "stopped": stopped,
        "steps": steps,
        "validation_perplexity": sequence_losses(model, validation, EVALUATION_BATCH)[1],
        "vocab_size": data.vocab_size,
    }


FineTune = Callable[[str, dict[str, Any], int, bool], Unit]


def fine_tunes(config: Config, start: Mapping[str, torch.Tensor]) -> FineTune:
    """``unit(method, point, seed, final)``: one fine-tune from the pretrained ``start``
    (:func:`language_unit`). Its key holds a digest of ``start`` (computed once here: 14 MB at
    full size), so a changed pretraining (code or config) never reuses fine-tunes of an
    earlier start."""
    if not start:  # an empty start would key, and fail only when it ran
        raise ValueError("a language fine-tune needs the pretrained weights it starts from")
    digest = tensors_digest(start)

    def unit(method: str, point: dict[str, Any], seed: int, final: bool) -> Unit:
        key = {**training_key("language", point, seed, final, method=method), "start": digest}
        arguments = (config, method, point, seed, final, start)
        return Unit(key, language_unit, arguments, config.threads)

    return unit


def _rounded(values: Sequence[float]) -> list[float]:
    return [round(value, DECIMALS) for value in values]


def _noisy(
    model: torch.nn.Module, data: DictDataset, gamma: float, seed: int, skip: Sequence[int]
) -> tuple[list[float], float]:
    with perturbed_embeddings(model, "gaussian", gamma, seed=seed, skip_token_ids=skip):
        return sequence_losses(model, data, EVALUATION_BATCH)


def language_unit(
    config: Config,
    method: str,
    point: dict[str, Any],
    seed: int,
    final: bool,
    start: Mapping[str, torch.Tensor],
) -> dict[str, Any]:
    """Fine-tune ``method`` at ``point`` from the pretrained ``start`` and ``seed``; selection
    runs (not ``final``): clean and noisy validation perplexity and per-window losses,
    validation layer losses; final runs: the start's and the model's test perplexity,
    per-window test losses clean and at every gamma, test layer losses."""
    spec = config.language
    data = training_data(spec)
    model = _model(spec, seed, data.vocab_size)
    model.load_state_dict(dict(start))
    test = language_test_data(spec) if final else None
    start_perplexity = (
        sequence_losses(model, test, EVALUATION_BATCH)[1] if test is not None else None
    )
    options = spec.options(method, point)
    try:
        training = train_model(
            model,
            method,
            data.finetune,
            task="lm",
            steps=spec.steps,
            batch_size=spec.batch_size,
            seed=seed,
            dual_lr=config.dual_lr,
            token_fraction=spec.token_fraction,
            progress=False,
            **options,  # lr, weight decay, alpha, resilient cost
        )
    except FloatingPointError:  # the loss or a gradient turned NaN: a diverged point
        if not final:
            return {
                **diverged_record(seed, SELECTION_SCORES),
                "validation_sequence_losses": None,
                "validation_noisy_sequence_losses": None,
            }
        diverged = diverged_record(
            seed, FINAL_SCORES, layer_losses=spec.layers + 1, gaussian=len(spec.gammas)
        )
        return {
            **diverged,
            "start_perplexity": start_perplexity,
            "sequence_losses": None,
            "noisy_sequence_losses": None,
        }
    record = training_fields(seed, training)
    alpha = options["alpha"] if method == "constrained" else max(spec.alphas)
    validation = validation_data(spec)
    probe = data.finetune.subset(
        spaced(torch.arange(len(data.finetune)), min(TRAIN_PROBE, len(validation)))
    )
    train_report = layer_report(model, probe, "lm", alpha, EVALUATION_BATCH)
    record["train_fraction_satisfied"] = train_report["fraction_satisfied"]
    if test is None:
        clean, perplexity = sequence_losses(model, validation, EVALUATION_BATCH)
        noisy, noisy_perplexity = _noisy(
            model, validation, spec.selection_gamma, SELECTION_NOISE_SEED, data.special_ids
        )
        record.update(
            validation_perplexity=perplexity,
            validation_noisy_perplexity=noisy_perplexity,
            validation_sequence_losses=_rounded(clean),
            validation_noisy_sequence_losses=_rounded(noisy),
        )
        record.update(layer_report(model, validation, "lm", alpha, EVALUATION_BATCH))
        return record
    clean, perplexity = sequence_losses(model, test, EVALUATION_BATCH)
    levels = [
        _noisy(model, test, gamma, TEST_NOISE_SEED + index, data.special_ids)
        for index, gamma in enumerate(spec.gammas)
    ]
    record.update(
        start_perplexity=start_perplexity,
        perplexity=perplexity,
        gaussian=[level[1] for level in levels],
        sequence_losses=_rounded(clean),
        noisy_sequence_losses=[_rounded(level[0]) for level in levels],
    )
    record.update(layer_report(model, test, "lm", alpha, EVALUATION_BATCH))
    return record
