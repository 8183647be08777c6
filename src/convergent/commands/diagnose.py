"""``convergent diagnose RUN_OR_CHECKPOINT [--data NAME]``: a report folder for a trained model.

An entry point: it rebuilds the model of one of our run folders (``config.json`` + the
newest checkpoint), loads a Hugging Face ``save_pretrained`` folder (a causal LM or a
sequence classifier, see :mod:`convergent.commands.hf_folders`) or takes the pretrained
MiniLM encoder (``"minilm"``), draws a batch of validation examples of ``NAME``, and writes
``summary.md``, ``diagnostics.json`` and PNGs of the layer-wise loss, the attention-output
spectra per layer, rank collapse, weight histograms and sparsity, and the norms of W_Q/W_K.

A Hugging Face model's layer-wise losses read each hidden state through its own head. The
spectra and W_Q/W_K norms cover BERT-family, Llama-style and GPT-2 attention (GPT-2's fused
``c_attn`` split into Q, K and V); they are skipped, with a note, where a model's attention
modules are a layout the hooks do not know.

Without a data source, a run is diagnosed on its own data (its ``config.json``), a folder that
``convergent prune --save`` wrote on the data it was scored on, another Hugging Face folder on
the default of its kind (as ``prune``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.commands.config import split_options
from convergent.commands.hf_folders import DEFAULT_DATA, evaluation_data
from convergent.commands.hf_reading import HUGGING_FACE, folder_kind, load_hf_folder
from convergent.commands.runs import load_run
from convergent.commands.sentence_embeddings import SENTENCE_EMBEDDING
from convergent.data import Splits, load_splits, minilm_path
from convergent.diagnostics import (
    SpectraRecorder,
    monotonicity_report,
    plots,
    query_key_norms,
    rank_collapse,
    weight_matrices,
    weight_statistics,
)
from convergent.losses import layerwise_readout_losses, losses_from_hidden_states, task_loss
from convergent.models import HFEncoder
from convergent.report import markdown_table
from convergent.train.batches import take, trim_padding
from convergent.wording import option

MINILM = "minilm"
# (hidden_states, labels, attention_mask) -> [L + 1] layer-wise losses.
LayerLosses = Callable[[Sequence[torch.Tensor], torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass
class LoadedModel:
    """A model ready to diagnose, with where it came from.

    Attributes:
        model: the model.
        splits: its data (the validation split is measured, else the test split).
        source: where the model came from, for the report.
        notes: lines for the report.
        layer_losses: ``(hidden_states, labels, attention_mask) -> [L + 1]`` losses, for
            models without our ``readout`` (None: ``model.readout``).
        attention_optional: skip, with a note, the spectra and W_Q/W_K norms of a model
            whose attention modules are not recognised, instead of raising.
        data: the data source it is diagnosed on.
    """

    model: nn.Module
    splits: Splits
    source: str
    notes: list[str]
    layer_losses: LayerLosses | None = None
    attention_optional: bool = False
    data: str = ""


def load_run_for_diagnosis(
    path: str | Path, data_name: str | None, seed: int | None = None
) -> LoadedModel:
    """A run folder's (or checkpoint's) model with its newest weights, on ``data_name``
    (None: the run's own data)."""
    run = load_run(path, data_name, seed)
    data = data_name or run.config.data
    notes = []
    if data != run.config.data:
        notes.append(f"the run was trained on {run.config.data!r}; diagnosed on {data!r}")
    source = f"{run.checkpoint} ({run.config.model})"
    return LoadedModel(run.model, run.splits, source, notes, data=data)


def _fit_head(model: Any, batch: dict[str, torch.Tensor], task: str) -> None:
    """Fit the linear readout on the last layer's pooled representation (L-BFGS)."""
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        hidden = model(**inputs, output_hidden_states=True).hidden_states[-1]
    optimizer = torch.optim.LBFGS(
        model.head.parameters(), max_iter=100, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = task_loss(model.readout(hidden, inputs.get("attention_mask")), batch["labels"], task)
        loss = loss + 1e-3 * model.head.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)


def load_minilm(data_name: str, seed: int, max_length: int, head_examples: int) -> LoadedModel:
    """Pretrained MiniLM-L6 with a linear head fitted on ``head_examples`` training examples."""
    splits = load_splits(data_name, seed=seed, **split_options(data_name, max_length))
    if splits.vocab_size is None or splits.task not in ("classification", "regression"):
        raise ValueError(
            f"data {data_name!r} is not text classification or regression; MiniLM needs "
            "token inputs (e.g. rt-sentences or hf:NAME)"
        )
    model = HFEncoder.from_pretrained(
        minilm_path(), task=splits.task, num_outputs=splits.num_outputs, pooling="mean"
    )
    count = min(head_examples, len(splits.train))
    _fit_head(model, take(splits.train, torch.arange(count)), splits.task)
    note = (
        f"MiniLM has no head of its own: the shared linear readout (mean pooling) was fitted "
        f"by L-BFGS on the last layer of {count} training examples, then applied to every layer"
    )
    return LoadedModel(model, splits, "pretrained MiniLM-L6", [note], data=data_name)


def hf_folder_data(path: str | Path, kind: str) -> tuple[str, str]:
    """The data a Hugging Face folder is diagnosed on when none is named, and why: the data
    ``convergent prune --save`` scored it on (its ``pruning.json``), else its kind's default."""
    try:
        pruned_on = json.loads((Path(path) / "pruning.json").read_text()).get("data")
    except (OSError, ValueError, AttributeError):
        pruned_on = None
    if isinstance(pruned_on, str):
        return pruned_on, "the data it was scored on when pruned (pruning.json)"
    return DEFAULT_DATA[kind], f"the default for a {kind} model"


def load_hf_for_diagnosis(
    path: str | Path, data_name: str | None, seed: int, max_length: int, examples: int
) -> LoadedModel:
    """A ``save_pretrained`` folder's model on the first ``examples`` validation examples of
    ``data_name`` (None: :func:`hf_folder_data`), tokenized with its own tokenizer."""
    loaded = load_hf_folder(path)
    if loaded.kind == SENTENCE_EMBEDDING:
        raise ValueError(
            f"{path} holds a sentence encoder without a head ({loaded.architecture}): diagnose"
            " reads its layer-wise losses through a head; prune scores such a model by its"
            " embeddings"
        )
    notes = []
    if data_name is None:
        data_name, why = hf_folder_data(path, loaded.kind)
        notes.append(f"diagnosed on {data_name!r}: {why}")
    data = evaluation_data(loaded, data_name, seed=seed, max_length=max_length, examples=examples)
    splits = Splits(
        train=data.dataset,  # unused: diagnose measures the validation split
        validation=data.dataset,
        test=data.dataset,
        task=data.task,
        num_outputs=int(getattr(loaded.model.config, "num_labels", 0)),
        seq_len=max_length,
        vocab_size=len(loaded.tokenizer),
    )
    head = "the output embedding after the final norm" if data.task == "lm" else "its classifier"
    note = f"layer-wise losses read every hidden state through {head}"
    return LoadedModel(
        loaded.model,
        splits,
        f"{loaded.path} ({loaded.architecture})",
        [*notes, note],
        layer_losses=functools.partial(layerwise_readout_losses, loaded),
        attention_optional=True,
        data=data_name,
    )


def _optional(
    measure: Callable[[], Any], loaded: LoadedModel, notes: list[str], what: str
) -> Any | None:
    """``measure()``, or None and a note where the model's attention layout is unknown and
    ``loaded.attention_optional`` allows going on without it."""
    try:
        return measure()
    except ValueError as error:
        if not loaded.attention_optional:
            raise
        notes.append(f"{what} skipped: {str(error).split(';')[0]}")
        return None


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def diagnose(
    path: str | Path,
    data_name: str | None,
    out_dir: str | Path,
    *,
    examples: int = 64,
    seed: int | None = None,
    max_length: int = 64,
    head_examples: int = 256,
) -> Path:
    """Diagnose a run folder, a checkpoint, a ``save_pretrained`` folder or ``"minilm"``.

    Args:
        path: a run folder of ``convergent train``, its ``checkpoints/`` folder, one
            checkpoint, a Hugging Face model folder, or the literal ``"minilm"``.
        data_name: a data source (``convergent data list``) or ``hf:NAME``; for a Hugging
            Face folder, text its tokenizer cuts (``austen`` too for a causal LM). None: a
            run's own data, a Hugging Face folder's (:func:`hf_folder_data`); MiniLM needs
            one.
        out_dir: where the report folder is written.
        examples: validation examples to measure on.
        seed: the split seed (default: the run's own; 0 for MiniLM and Hugging Face folders).
        max_length: tokens per text example for MiniLM and Hugging Face folders (runs use
            their own).
        head_examples: training examples used to fit MiniLM's readout head.

    Returns:
        The path of ``summary.md``.

    Raises:
        CheckpointError: a missing or foreign checkpoint.
        ValueError: bad arguments, or a model of ours whose attention modules cannot be found.
    """
    if examples < 1:
        raise ValueError(f"{option('examples', examples)} is out of range; it must be >= 1.")
    if str(path) == MINILM:
        if data_name is None:
            raise ValueError(
                f"diagnosing pretrained MiniLM needs {option('data')}: a text source, e.g. "
                "rt-sentences or hf:NAME"
            )
        loaded = load_minilm(data_name, 0 if seed is None else seed, max_length, head_examples)
    elif folder_kind(path) == HUGGING_FACE:
        split_seed = 0 if seed is None else seed
        loaded = load_hf_for_diagnosis(path, data_name, split_seed, max_length, examples)
    else:
        loaded = load_run_for_diagnosis(path, data_name, seed)
    model, splits, notes = loaded.model, loaded.splits, list(loaded.notes)
    model.eval()
    dataset = splits.validation if len(splits.validation) else splits.test
    count = min(examples, len(dataset))
    batch = trim_padding(take(dataset, torch.arange(count)))
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    mask = inputs.get("attention_mask")
    recorder = _optional(lambda: SpectraRecorder(model), loaded, notes, "attention-output spectra")
    # One forward pass serves the spectra hooks, the layer-wise losses and rank collapse.
    with recorder if recorder is not None else contextlib.nullcontext(), torch.no_grad():
        hidden_states = model(**inputs, output_hidden_states=True).hidden_states
    if recorder is not None and not recorder.records:
        raise RuntimeError(f"the forward pass of {type(model).__name__} recorded no spectra")
    spectra = recorder.records[-1][1] if recorder is not None else None
    with torch.no_grad():
        if loaded.layer_losses is not None:
            losses = loaded.layer_losses(hidden_states, batch["labels"], mask).tolist()
        else:
            losses = losses_from_hidden_states(
                model.readout, hidden_states, batch["labels"], splits.task, mask
            ).tolist()
    monotone = monotonicity_report(losses)
    collapse = torch.stack([rank_collapse(hidden, mask) for hidden in hidden_states])
    weights = weight_matrices(model)
    weight_rows = weight_statistics(model)
    norms = _optional(lambda: query_key_norms(model), loaded, notes, "W_Q/W_K norms") or []

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    figures = [
        plots.plot_layerwise_losses(losses, folder / "layerwise_loss.png"),
        *([plots.plot_spectra(spectra, folder / "spectra.png")] if spectra else []),
        plots.plot_rank_collapse(collapse, folder / "rank_collapse.png"),
        plots.plot_weights(weights, weight_rows, folder / "weights.png"),
        *([plots.plot_query_key_norms(norms, folder / "query_key_norms.png")] if norms else []),
    ]
    spectra_rows = spectra.layer_means() if spectra is not None else []
    collapse_rows = [
        {"layer": index, "median": float(row.median()), "mean": float(row.mean())}
        for index, row in enumerate(collapse)
    ]
    total = sum(w.numel() for w in weights.values())
    zeros = sum(int((w == 0).sum()) for w in weights.values())
    payload = {
        "source": loaded.source,
        "data": loaded.data,
        "examples": count,
        "task": splits.task,
        "notes": notes,
        "layerwise_losses": losses,
        "monotonicity": {
            "fraction_satisfied": monotone.fraction_satisfied,
            "is_monotone": monotone.is_monotone,
            "largest_increase": monotone.largest_increase,
        },
        "spectra": [
            {k: _finite(v) if isinstance(v, float) else v for k, v in row.items()}
            for row in spectra_rows
        ],
        "rank_collapse": collapse_rows,
        "weights": {"matrices": weight_rows, "sparsity": zeros / max(total, 1)},
        "query_key_norms": norms,
        "figures": [figure.name for figure in figures],
    }
    (folder / "diagnostics.json").write_text(json.dumps(payload, indent=2) + "\n")
    summary = folder / "summary.md"
    summary.write_text(_markdown(payload, spectra_rows))
    return summary


def _markdown(payload: dict[str, Any], spectra_rows: list[dict[str, Any]]) -> str:
    losses = payload["layerwise_losses"]
    monotone = payload["monotonicity"]
    lines = [
        f"# Diagnostics: {payload['source']}",
        "",
        f"Data: `{payload['data']}` ({payload['task']}), {payload['examples']} validation examples.",
        "",
    ]
    lines += [f"- {note}" for note in payload["notes"]]
    lines += [
        "",
        "## Layer-wise loss",
        "",
        f"f_0 .. f_L = {', '.join(f'{v:.4f}' for v in losses)}; "
        f"{monotone['fraction_satisfied']:.0%} of layers decrease the loss "
        f"(largest increase {monotone['largest_increase']:.4f}).",
        "",
        "![layer-wise loss](layerwise_loss.png)",
        "",
    ]
    if spectra_rows:
        lines += [
            "## Attention-output spectra (mean over examples; condition: median)",
            "",
            markdown_table(spectra_rows),
            "![spectra](spectra.png)",
            "",
        ]
    lines += [
        "## Rank collapse: ||X - 1 mean^T||_F / ||X||_F per hidden state",
        "",
        markdown_table(payload["rank_collapse"]),
        "![rank collapse](rank_collapse.png)",
        "",
        "## Weights",
        "",
        f"Overall sparsity (exact zeros): {payload['weights']['sparsity']:.2%} over "
        f"{len(payload['weights']['matrices'])} matrices.",
        "",
        markdown_table(payload["weights"]["matrices"]),
        "![weights](weights.png)",
        "",
    ]
    if payload["query_key_norms"]:
        lines += [
            "## Norms of W_Q and W_K",
            "",
            markdown_table(payload["query_key_norms"]),
            "![query/key norms](query_key_norms.png)",
            "",
        ]
    return "\n".join(lines)
