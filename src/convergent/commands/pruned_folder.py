"""What ``convergent prune --save`` writes: the pruned model (compressed unless ``--dense``)
and its report, with the weights' sizes and, when asked, ``convergent bench``'s figures.

The model goes through :func:`~convergent.commands.compressed.write_model_folder`, so the
report is written into the same staging folder before the rename: a reader sees the model
and its report together, or neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from convergent.commands.benchmark import bench, format_bench
from convergent.commands.compressed import (
    MIB,
    positive_zeros_,
    weights_files,
    write_model_folder,
)
from convergent.report import markdown_table
from convergent.sparse.storage import (
    compressed_files,
    encode_state_dict,
    group_dims,
    read_header,
    size_rows,
)
from convergent.train import resolve_checkpoint

# Why a report has no speed and memory figures: left out when asked, or never measurable.
NOT_BENCHED = "left out (prune --no-bench); `convergent bench FOLDER` measures them"
NOT_BENCHED_STREAMED = (
    "not measured: `--low-memory` never holds the whole model, and `convergent bench` loads it"
    " whole; run `convergent bench FOLDER` on a machine where the model fits in memory"
)


@dataclass(frozen=True)
class SaveOptions:
    """How ``prune --save`` writes the pruned model.

    Attributes:
        dense: write an ordinary folder (``model.safetensors``) that other tools read,
            instead of compressed weights.
        bench: add ``convergent bench``'s figures (dense against sparse kernels) to the
            report; a few seconds to a few minutes, by the model's size.
        threads: torch threads for those figures (None: torch's current setting).
    """

    dense: bool = False
    bench: bool = False
    threads: int | None = None


def size_summary(folder: Path, model: nn.Module, layers: list[str]) -> dict[str, Any]:
    """The weights file's size, and each pruned matrix's dense and compressed bytes.

    Args:
        folder: the written folder (compressed or not).
        model: the model written (a dense folder's compressed sizes are computed from it).
        layers: the pruned matrices, listed per layer.
    """
    files = weights_files(folder)
    compressed = bool(compressed_files(files[0].parent))
    if compressed:  # one file, or a streamed model's shards
        header = {"tensors": {k: v for f in files for k, v in read_header(f)["tensors"].items()}}
    elif any(parameter.is_meta for parameter in model.parameters()):
        # a dense folder streamed block by block: the model is not in memory to be encoded
        header = {"tensors": {}}
    else:
        header = encode_state_dict(model.state_dict(), group_dims(model))[1]
    rows = size_rows(header)
    file_bytes = sum(file.stat().st_size for file in files)
    wanted = set(layers)
    return {
        "file": files[0].name if len(files) == 1 else f"{len(files)} files",
        "file_bytes": file_bytes,
        "compressed": compressed,
        "dense_bytes": sum(row["dense_bytes"] for row in rows) if rows else file_bytes,
        "compressed_bytes": sum(row["stored_bytes"] for row in rows) if rows else None,
        "layers": [row for row in rows if row["name"] in wanted],
    }


def save_pruned(
    folder: Path,
    model: nn.Module,
    summary: dict[str, Any],
    write_report: Callable[[Path, dict[str, Any]], None],
    options: SaveOptions | None = None,
    **folder_options: Any,
) -> Path:
    """Write a pruned model and its report as one new folder (``prune --save``).

    Compressed unless ``options.dense``; ``summary`` gains ``saved``, ``sizes`` and, with
    ``options.bench``, ``bench``, before ``write_report(staging, summary)`` writes the
    report beside the model.

    Args:
        folder: the new folder.
        model: the pruned model (its zeros are written as +0.0: :func:`positive_zeros_`).
        summary: the pruning summary.
        write_report: writes ``pruning.json``, ``pruning.md`` and ``pruning.png``.
        options: :class:`SaveOptions` (None: its defaults).
        **folder_options: :func:`write_model_folder`'s ``tokenizer``, ``run_config``,
            ``step`` and ``state``.

    Returns:
        The weights' folder (the checkpoint for a run).
    """
    options = options or SaveOptions()
    if not options.dense:
        positive_zeros_(model)
    layers = [row["name"] for row in summary.get("layers", [])]
    is_run = folder_options.get("run_config") is not None
    final = folder  # the weights' folder, filled in below once known

    def finish(staging: Path) -> None:
        summary["sizes"] = size_summary(staging, model, layers)
        if options.bench:
            summary["bench"] = bench(staging, threads=options.threads)
            summary["bench"]["source"] = str(folder)
        else:
            summary["bench_skipped"] = NOT_BENCHED
        summary["saved"] = str(final if not is_run else folder / _relative_checkpoint(staging))
        write_report(staging, summary)

    return write_model_folder(
        folder, model, compressed=not options.dense, finish=finish, **folder_options
    )


def _relative_checkpoint(staging: Path) -> Path:
    return resolve_checkpoint(staging).relative_to(staging)


def saved_lines(summary: dict[str, Any]) -> list[str]:
    """What ``prune`` prints about the written weights: their size, and how to load them."""
    sizes = summary.get("sizes")
    if not sizes:
        return []
    share = sizes["file_bytes"] / max(sizes["dense_bytes"], 1)
    how = (
        "compressed; load_sparse and, after import convergent, from_pretrained read them"
        if sizes["compressed"]
        else "dense"
    )
    return [
        f"weights: {sizes['file']}, {sizes['file_bytes'] / MIB:.2f} MiB, {share:.1%} of the dense"
        f" weights ({how})"
    ]


def saved_markdown(summary: dict[str, Any]) -> list[str]:
    """The report's lines on the written folder: how to load it, sizes, speed and memory."""
    sizes = summary.get("sizes")
    if not sizes:
        return []
    dense, stored = sizes["dense_bytes"], sizes["compressed_bytes"]
    if sizes["compressed"]:
        loading = (
            f"`{sizes['file']}` holds the weights compressed: {sizes['file_bytes'] / MIB:.2f} MiB, "
            f"{sizes['file_bytes'] / max(dense, 1):.1%} of the {dense / MIB:.2f} MiB of dense "
            "weights in the same dtypes. The `convergent` package (`pip install convergent`) "
            "reads this format: `convergent prune`, `diagnose` and `bench` read this folder, "
            '`convergent.commands.load_sparse("FOLDER")` returns the model bit for bit, and '
            "after `import convergent` so does transformers' own `from_pretrained` "
            "(`config.json`'s `quantization_config` names the format, `convergent-sparse`; "
            "without convergent, transformers warns of that unknown method and finds no "
            "weights)."
        )
    elif stored is None:
        return [
            "",
            "## Size on disk",
            "",
            f"`{sizes['file']}` hold the weights dense ({sizes['file_bytes'] / MIB:.2f} MiB),"
            " readable by any tool.",
            "",
            *_speed_lines(summary),
        ]
    else:
        loading = (
            f"`{sizes['file']}` holds the weights dense ({sizes['file_bytes'] / MIB:.2f} MiB), "
            "readable by any tool; compressed (`prune --save` without `--dense`) they would "
            f"take {stored / MIB:.2f} MiB, {stored / max(dense, 1):.1%} of that."
        )
    rows = [
        {
            "matrix": row["name"],
            "layout": row["kind"],
            "dense KiB": round(row["dense_bytes"] / 1024, 1),
            "compressed KiB": round(row["stored_bytes"] / 1024, 1),
            "compressed / dense": round(row["stored_bytes"] / max(row["dense_bytes"], 1), 4),
        }
        for row in sizes["layers"]
    ]
    rows.append(
        {
            "matrix": "all weights",
            "layout": "",
            "dense KiB": round(dense / 1024, 1),
            "compressed KiB": round(stored / 1024, 1),
            "compressed / dense": round(stored / max(dense, 1), 4),
        }
    )
    return ["", "## Size on disk", "", loading, "", markdown_table(rows), *_speed_lines(summary)]


def _speed_lines(summary: dict[str, Any]) -> list[str]:
    """The report's speed and memory section: bench's figures, or why there are none."""
    heading = "## Speed and memory: dense against sparse kernels"
    if summary.get("bench"):
        return [heading, "", format_bench(summary["bench"])]
    if summary.get("bench_skipped"):
        return [heading, "", f"Speed and memory figures {summary['bench_skipped']}."]
    return []
