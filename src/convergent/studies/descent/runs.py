"""What one unit of the ``descent`` study computes: :func:`part_unit` trains one method at one
grid point from one seed, then measures it.

Selection runs (``final=False``) train for the grid's steps and are scored on the validation
split only (a denoiser grid run never loads a test frame: :func:`video_selection_data`); final
runs train for the final steps and are scored on test, and a final text run also records which
test sentences it classified correctly (``clean_correct``, the clean claim's paired test).
Every run records how hard its constraints pushed
(:func:`~convergent.studies.descent.measures.dual_trajectory`), the study's manipulation check.
:func:`text_unit` and :func:`video_unit` return what ``torch.load(weights_only=True)`` reads
back, for the resumable unit cache.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from convergent.data import (
    DictDataset,
    load_rt_sentences,
    load_street_video,
    perturb_texts,
    tokenize,
)
from convergent.studies.descent.config import Config
from convergent.studies.descent.measures import (
    denoising_rmse,
    dual_trajectory,
    layer_report,
    multiplier_activity,
    noisy_pairs,
    robustness,
)
from convergent.studies.descent.models import denoiser, train_model
from convergent.studies.engine import Unit, training_key
from convergent.studies.framework import correct_per_example, minilm_classifier, rt_sentences
from convergent.train import evaluate

EMBEDDING_SHIFTS = ("gaussian", "uniform", "discrete")  # the rest shift the text itself
TASKS = {"text": "classification", "video": "regression"}
TRAIN_PROBE = 1024  # training examples scored for "constraints satisfied on train"
SELECTION_NOISE_SEED = 500  # the validation noise draw of the text selection score


def part_unit(
    config: Config, part: str, method: str, point: dict[str, Any], seed: int, final: bool
) -> Unit:
    """One training run: ``part`` is ``"text"`` (MiniLM on rt-sentences, :func:`text_unit`) or
    ``"video"`` (the denoiser on street-video crops, :func:`video_unit`)."""
    compute = text_unit if part == "text" else video_unit
    key = training_key(part, point, seed, final, method=method)
    return Unit(key, compute, (config, method, point, seed, final), config.threads)


@dataclass(frozen=True)
class TextData:
    """rt-sentences as the study uses it: tokenized splits and the raw test sentences."""

    train: DictDataset
    validation: DictDataset
    test: DictDataset
    test_texts: list[str]
    special_ids: list[int]
    tokenizer: Any


@functools.lru_cache(maxsize=2)
def text_data(
    max_length: int, train: int | None, validation: int | None, test: int | None
) -> TextData:
    """The splits (seed 0), each cut to its first examples, loaded once per process
    (:func:`~convergent.studies.framework.rt_sentences`), with the raw test sentences."""
    sentences = rt_sentences(max_length, train, validation, test)
    texts, _ = load_rt_sentences()
    return TextData(
        train=sentences.train,
        validation=sentences.validation,
        test=sentences.test,
        test_texts=[texts[i] for i in sentences.test_indices],
        special_ids=list(sentences.tokenizer.all_special_ids),
        tokenizer=sentences.tokenizer,
    )


def text_shift_accuracies(
    model: torch.nn.Module,
    data: TextData,
    kind: str,
    rates: Sequence[float],
    seed: int,
    max_length: int,
) -> list[float]:
    """Test accuracy on sentences perturbed by ``kind`` (typos, word dropout) at each rate,
    re-tokenized; the draws depend only on ``seed`` and the rate's index (paired models)."""
    labels = data.test.tensors["labels"]
    accuracies = []
    for index, rate in enumerate(rates):
        texts = perturb_texts(data.test_texts, kind, rate, seed=seed + index)
        shifted = DictDataset({**tokenize(texts, data.tokenizer, max_length), "labels": labels})
        accuracies.append(evaluate(model, shifted, "classification")["accuracy"])
    return accuracies


def training_fields(seed: int, training: Mapping[str, Any]) -> dict[str, Any]:
    """What every unit records of its training (``train_model``'s result): the loss, the final
    multipliers, how hard they pushed and their trajectory."""
    return {
        "seed": seed,
        "train_loss": training["train_loss"],
        "multipliers": training["multipliers"],
        **multiplier_activity(training["history"]),
        "trajectory": dual_trajectory(training["history"]),
    }


def _trained(
    config: Config,
    method: str,
    point: dict[str, Any],
    seed: int,
    part: str,
    model: torch.nn.Module,
    train: Any,
    final: bool,
) -> tuple[dict[str, Any] | None, float]:
    """``model`` trained on ``train``: its record with the share of constraints satisfied on
    train (None where it diverged) and the alpha its layer reports use (ERM: the largest)."""
    options = config.options(method, point, part)
    task = TASKS[part]
    steps = getattr(config, f"{part}_steps" if final else f"{part}_grid_steps")
    try:
        training = train_model(
            model,
            method,
            train,
            task=task,
            steps=steps,
            batch_size=getattr(config, f"{part}_batch_size"),
            seed=seed,
            dual_lr=config.dual_lr,
            progress=False,
            **options,  # lr, weight decay, alpha, resilient cost
        )
    except FloatingPointError:  # the loss or a gradient turned NaN: a diverged point
        return None, math.nan
    alpha = options["alpha"] if method == "constrained" else max(config.constrained_alphas)
    report = layer_report(model, _probe(train), task, alpha)
    return {
        **training_fields(seed, training),
        "train_fraction_satisfied": report["fraction_satisfied"],
    }, alpha


# What a diverged run scores: NaN, so that selection skips it and the claims drop its seed.
LAYER_SCORES = ("fraction_satisfied", "largest_increase", "train_fraction_satisfied")
TEXT_SELECTION_SCORES = ("validation_clean", "validation_robust", *LAYER_SCORES)
TEXT_SCORES = ("clean", *LAYER_SCORES)
VIDEO_SELECTION_SCORES = ("validation_rmse_train_noise", "validation_rmse_selection", *LAYER_SCORES)
VIDEO_SCORES = LAYER_SCORES


def diverged_record(seed: int, scores: Sequence[str], **lists: int) -> dict[str, Any]:
    """The unit of a run whose loss or gradient turned NaN: ``diverged``, NaN ``scores`` and,
    for each ``name=length`` of ``lists``, a list of that many NaNs."""
    return {
        **{name: [math.nan] * length for name, length in lists.items()},
        "seed": seed,
        "diverged": True,
        "train_loss": math.nan,
        "multipliers": [],
        "multiplier_max": None,
        "multiplier_active_share": None,
        "trajectory": dual_trajectory([]),
        **dict.fromkeys(scores, math.nan),
    }


def _probe(dataset: DictDataset) -> DictDataset:
    return dataset if len(dataset) <= TRAIN_PROBE else dataset.subset(torch.arange(TRAIN_PROBE))


def text_unit(
    config: Config, method: str, point: dict[str, Any], seed: int, final: bool
) -> dict[str, Any]:
    """Train ``method`` at ``point`` on text from ``seed``; selection runs (not ``final``):
    clean and noisy validation accuracy and validation layer losses; final runs: every test
    perturbation and test layer losses."""
    data = text_data(
        config.max_length,
        config.train_examples,
        config.validation_examples,
        config.test_examples,
    )
    model = minilm_classifier(seed, config.text_layers)  # a fresh mean-pooled 2-class head
    record, report_alpha = _trained(config, method, point, seed, "text", model, data.train, final)
    if record is None:
        if not final:
            return diverged_record(seed, TEXT_SELECTION_SCORES)
        diverged = diverged_record(
            seed,
            TEXT_SCORES,
            layer_losses=model.num_layers + 1,
            **{kind: len(levels) for kind, levels in config.text_levels().items()},
        )
        return {**diverged, "clean_correct": None}  # no sentence scored
    if not final:
        noisy = robustness(
            model,
            data.validation,
            {"gaussian": (config.selection_gamma,)},
            data.special_ids,
            seed=SELECTION_NOISE_SEED,
        )
        record["validation_clean"] = noisy["clean"]
        record["validation_robust"] = noisy["gaussian"][0]
        record.update(layer_report(model, data.validation, "classification", report_alpha))
        return record
    levels = {kind: config.text_levels()[kind] for kind in EMBEDDING_SHIFTS}
    record.update(robustness(model, data.test, levels, data.special_ids, seed=1000))
    record["clean_correct"] = correct_per_example(model, data.test)
    record["typos"] = text_shift_accuracies(
        model, data, "typos", config.typo_rates, 3000, config.max_length
    )
    record["word_dropout"] = text_shift_accuracies(
        model, data, "word_dropout", config.dropout_rates, 4000, config.max_length
    )
    record.update(layer_report(model, data.test, "classification", report_alpha))
    return record


def video_crops(
    frames: torch.Tensor, count: int, crop: int, patch: int, generator: torch.Generator
) -> torch.Tensor:
    """Random ``crop`` x ``crop`` pixel crops as tokens of ``patch`` x ``patch`` pixels.

    Args:
        frames: uint8 ``[F, H, W]`` gray frames.
        count: how many crops.
        crop: crop side in pixels (a multiple of ``patch``).
        patch: token side in pixels.
        generator: the random source.

    Returns:
        float ``[count, (crop / patch) ** 2, patch * patch]`` in [0, 1].
    """
    if crop % patch:
        raise ValueError(f"crop {crop} must be a multiple of the patch size {patch}")
    number, height, width = frames.shape
    f = torch.randint(0, number, (count,), generator=generator)
    y = torch.randint(0, height - crop + 1, (count,), generator=generator)
    x = torch.randint(0, width - crop + 1, (count,), generator=generator)
    rows = y[:, None] + torch.arange(crop)
    cols = x[:, None] + torch.arange(crop)
    pixels = frames[f[:, None, None], rows[:, :, None], cols[:, None, :]].float() / 255.0
    side = crop // patch
    tokens = pixels.reshape(count, side, patch, side, patch).permute(0, 1, 3, 2, 4)
    return tokens.reshape(count, side * side, patch * patch)


def clean_video_crops(
    frames: int, crop: int, patch: int, counts: Sequence[int]
) -> list[torch.Tensor]:
    """Clean crops of the first ``len(counts)`` splits, in the order train, validation, test.

    The frames are split by time (first 60 %, next 15 %, last 25 %: different moments of the
    street) and every split's crops come from one generator (seed 0), drawn in that order, so
    each split's crops are the same whether or not a later split is drawn. Asked for two
    counts, no test frame is read.
    """
    video = load_street_video(max_frames=frames)
    first, second = int(0.6 * len(video)), int(0.75 * len(video))
    splits = (video[:first], video[first:second], video[second:])
    generator = torch.Generator().manual_seed(0)
    return [
        video_crops(split, count, crop, patch, generator)
        for split, count in zip(splits, counts, strict=False)
    ]


@functools.lru_cache(maxsize=2)
def video_selection_data(
    frames: int, crop: int, patch: int, train: int, validation: int, noise: float
) -> tuple[DictDataset, torch.Tensor, DictDataset]:
    """Training pairs, clean validation crops and validation pairs at the training noise: all
    a grid run (and the regime pilot) reads; no test frame."""
    train_clean, validation_clean = clean_video_crops(frames, crop, patch, (train, validation))
    return (
        noisy_pairs(train_clean, noise, seed=1),
        validation_clean,
        noisy_pairs(validation_clean, noise, seed=2500),
    )


@functools.lru_cache(maxsize=2)
def video_test_data(
    frames: int, crop: int, patch: int, train: int, validation: int, test: int, noise: float
) -> tuple[torch.Tensor, DictDataset]:
    """Clean test crops and test pairs at the training noise, read by final runs only."""
    *_, test_clean = clean_video_crops(frames, crop, patch, (train, validation, test))
    return test_clean, noisy_pairs(test_clean, noise, seed=3000)


def video_unit(
    config: Config, method: str, point: dict[str, Any], seed: int, final: bool
) -> dict[str, Any]:
    """Train ``method`` at ``point`` on the denoiser from ``seed``; selection runs (not
    ``final``): validation RMSE at the training and the selection noise; final runs: test RMSE
    at every level and test layer losses."""
    train, validation_clean, validation_pairs = video_selection_data(
        config.video_frames,
        config.crop,
        config.patch,
        config.train_crops,
        config.validation_crops,
        config.train_noise,
    )
    tokens = (config.crop // config.patch) ** 2
    model = denoiser(seed, config.patch, tokens, config.denoiser_width, config.denoiser_layers)
    record, report_alpha = _trained(config, method, point, seed, "video", model, train, final)
    if record is None:
        if not final:
            return diverged_record(seed, VIDEO_SELECTION_SCORES)
        return diverged_record(
            seed,
            VIDEO_SCORES,
            layer_losses=config.denoiser_layers + 1,
            rmse=len(config.noise_multiples),
        )
    if not final:
        sigmas = [config.train_noise, config.selection_multiple * config.train_noise]
        at_training, at_selection = denoising_rmse(model, validation_clean, sigmas, 2200)
        record["validation_rmse_train_noise"] = at_training
        record["validation_rmse_selection"] = at_selection
        record.update(layer_report(model, validation_pairs, "regression", report_alpha))
        return record
    test_clean, test_pairs = video_test_data(
        config.video_frames,
        config.crop,
        config.patch,
        config.train_crops,
        config.validation_crops,
        config.test_crops,
        config.train_noise,
    )
    sigmas = [m * config.train_noise for m in config.noise_multiples]
    record["rmse"] = denoising_rmse(model, test_clean, sigmas, seed=2000)
    record.update(layer_report(model, test_pairs, "regression", report_alpha))
    return record
