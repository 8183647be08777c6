"""``convergent prune``: one-shot magnitude pruning of a trained run folder or checkpoint.

The run folder written by ``convergent train`` holds ``config.json`` and checkpoints; the
model is rebuilt from the config, its newest (or the named) checkpoint is loaded, and for
each sparsity a copy is pruned and evaluated on the validation split (loss, accuracy, and
perplexity for language models). With ``save_to``, the model pruned at the last sparsity is
written as a run folder (the run's ``config.json`` and ``checkpoints/``, so ``diagnose`` and
``prune`` take it) whose checkpoint state holds the masks (``{"masks": ..., "pruning": ...}``,
loadable with ``weights_only=True``); the masks can also be rebuilt from its weights alone
(``Masks.from_weights``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from ..report import markdown_table
from ..sparse import prune_one_shot
from ..sparse.masks import check_sparsity
from ..train import evaluate, save_checkpoint
from ..train.checkpoint import write_text_atomically
from .runs import load_run, prepare_new_run

logger = logging.getLogger(__name__)


def prune_run(
    path: str | Path,
    sparsities: tuple[float, ...] = (0.5, 0.7, 0.9),
    *,
    distribution: str = "uniform",
    pattern: str = "unstructured",
    include_embeddings: bool = False,
    include_first: bool = True,
    include_last: bool = False,
    save_to: str | Path | None = None,
) -> dict[str, Any]:
    """Prune a trained run one-shot at each sparsity and evaluate it on validation data.

    Args:
        path: a run folder, its ``checkpoints`` folder or one checkpoint folder.
        sparsities: targets in [0, 1).
        distribution: ``"uniform"`` (layer-wise, default) or ``"global"``.
        pattern: ``"unstructured"`` or ``"N:M"``.
        include_embeddings, include_first, include_last: see
            :func:`~convergent.sparse.prune_one_shot`.
        save_to: write the model pruned at the last sparsity here, as a run folder
            (``config.json`` and ``checkpoints/``) that ``diagnose`` and ``prune`` accept.

    Returns:
        ``{"checkpoint", "task", "dense": metrics, "rows": [per sparsity: target,
        sparsity, metrics], "excluded", "notes", "saved"}``.
    """
    for target in sparsities:
        check_sparsity(target)
    run = load_run(path)
    model, splits, state, checkpoint = run.model, run.splits, run.state, run.checkpoint
    dense = evaluate(model, splits.validation, splits.task)
    rows, report = [], None
    pruned = model
    for target in sparsities:
        pruned = copy.deepcopy(model)
        report = prune_one_shot(
            pruned,
            target,
            distribution=distribution,
            pattern=pattern,
            include_embeddings=include_embeddings,
            include_first=include_first,
            include_last=include_last,
        )
        rows.append(
            {
                "target": target,
                "sparsity": report.sparsity,
                **evaluate(pruned, splits.validation, splits.task),
            }
        )
    saved = None
    if save_to is not None and report is not None:
        prepare_new_run(save_to)
        write_text_atomically(
            Path(save_to) / "config.json",
            json.dumps(dataclasses.asdict(run.config), indent=2) + "\n",
        )
        saved = save_checkpoint(
            Path(save_to) / "checkpoints",
            int(state.get("step", 0)),
            pruned,
            {"masks": report.masks.state_dict(), "pruning": report.summary()},
            keep=1,
        )
        logger.info("pruned checkpoint written to %s", saved)
    return {
        "checkpoint": str(checkpoint),
        "task": splits.task,
        "dense": dense,
        "rows": rows,
        "excluded": report.excluded if report else {},
        "notes": report.notes if report else [],
        "saved": str(saved) if saved else None,
    }


def format_prune_summary(summary: dict[str, Any]) -> str:
    """The text ``convergent prune`` prints: a markdown table, the exclusions, the output."""
    keys = [key for key in ("loss", "accuracy", "perplexity", "rmse") if key in summary["dense"]]
    rows = [{"target": "dense", "sparsity": 0.0, **{k: summary["dense"][k] for k in keys}}]
    rows += [
        {"target": row["target"], "sparsity": row["sparsity"], **{k: row[k] for k in keys}}
        for row in summary["rows"]
    ]
    lines = [f"checkpoint: {summary['checkpoint']} ({summary['task']}, validation split)", ""]
    lines.append(markdown_table(rows))
    lines += [f"note: {note}" for note in summary["notes"]]
    if summary.get("saved"):
        lines.append(f"pruned checkpoint: {summary['saved']}")
    return "\n".join(lines)
