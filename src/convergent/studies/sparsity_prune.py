"""``convergent prune``: one-shot magnitude pruning of a trained run folder or checkpoint.

The run folder written by ``convergent train`` holds ``config.json`` and checkpoints; the
model is rebuilt from the config, its newest (or the named) checkpoint is loaded, and for
each sparsity a copy is pruned and evaluated on the validation split (loss, accuracy, and
perplexity for language models). With ``save_to``, the model pruned at the last sparsity is
written as a checkpoint whose state holds the masks (``{"masks": ..., "pruning": ...}``,
loadable with ``weights_only=True``); the masks can also be rebuilt from its weights alone
(``Masks.from_weights``).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

from ..sparse import prune_one_shot
from ..train import evaluate, load_checkpoint, resolve_checkpoint, save_checkpoint
from ..train.checkpoint import CheckpointError

logger = logging.getLogger(__name__)


def find_run_config(path: Path) -> Path:
    """The ``config.json`` of the run that ``path`` (run, checkpoints or checkpoint) is in."""
    for folder in (path, *path.parents[:3]):
        if (folder / "config.json").is_file():
            return folder / "config.json"
    raise CheckpointError(
        f"no config.json in {path} or the three folders above it; pass a run folder written"
        " by 'convergent train'"
    )


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
        sparsities: targets in [0, 1].
        distribution: ``"uniform"`` (layer-wise, default) or ``"global"``.
        pattern: ``"unstructured"`` or ``"N:M"``.
        include_embeddings, include_first, include_last: see
            :func:`~convergent.sparse.prune_one_shot`.
        save_to: write the model pruned at the last sparsity here as a checkpoint folder.

    Returns:
        ``{"checkpoint", "task", "dense": metrics, "rows": [per sparsity: target,
        sparsity, metrics], "excluded", "notes", "saved"}``.
    """
    from ..data import load_splits
    from ..train.recipe import TrainConfig, build_model

    for target in sparsities:
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"every sparsity must be in [0, 1], got {target}")
    checkpoint = resolve_checkpoint(path)
    config = TrainConfig.from_dict(json.loads(find_run_config(Path(path)).read_text()))
    options: dict[str, Any] = {}
    if config.data == "rt-sentences" or config.data.startswith("hf:"):
        options["max_length"] = config.max_length
    splits = load_splits(config.data, seed=config.seed, **options)
    model = build_model(config, splits)
    state = load_checkpoint(checkpoint, model)
    dense = evaluate(model, splits.validation, splits.task)
    rows, report = [], None
    pruned = model
    for target in sparsities:
        pruned = copy.deepcopy(model)
        report = prune_one_shot(pruned, target, distribution=distribution, pattern=pattern,
                                include_embeddings=include_embeddings,
                                include_first=include_first, include_last=include_last)  # fmt: skip
        rows.append({"target": target, "sparsity": report.sparsity,
                     **evaluate(pruned, splits.validation, splits.task)})  # fmt: skip
    saved = None
    if save_to is not None and report is not None:
        saved = save_checkpoint(Path(save_to), int(state.get("step", 0)), pruned,
                                {"masks": report.masks.state_dict(), "pruning": report.summary()},
                                keep=1)  # fmt: skip
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
    from ..report import markdown_table

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
