"""``convergent bench FOLDER_OR_RUN``: a model's forward speed, file size and peak memory, dense
against sparse kernels.

For each length T (1, 16 and 128 tokens by default) one ``[1, T]`` forward pass without a KV
cache is timed, dense and with :func:`~convergent.sparse.kernels.to_sparse_kernels` (layers
chosen by a timing at ``T`` tokens), in turn in one process so that the machine's load falls
on both alike: the fastest of the samples (other processes only ever add time), as latency
and tokens per second. The weights' size is the
folder's file against the dense weights in the same dtypes. Peak memory is measured in one
fresh process per variant (a process's peak only ever rises): its resident-set peak while it
loads the model, converts it and runs one forward at each T, and that peak above the process
after its imports.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import logging
import os
import resource
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.commands.compressed import MIB, weights_files
from convergent.commands.decode_speed import bench_generation, generation_line
from convergent.commands.hf_reading import HUGGING_FACE, folder_kind, load_hf_folder
from convergent.commands.runs import load_run
from convergent.report import markdown_table
from convergent.sparse.kernels import (
    CAUSES,
    TIMING_REPEATS,
    fastest_speedup,
    timed_samples,
    to_sparse_kernels,
)
from convergent.sparse.storage import COMPRESSED_WEIGHTS, encode_state_dict, group_dims
from convergent.wording import option

LENGTHS = (1, 16, 128)
DEVICES = ("cpu", "cuda")
VARIANTS = ("dense", "sparse")
WORKER_TIMEOUT = 1800.0


def load_for_bench(path: str | Path) -> tuple[nn.Module, str]:
    """The model of a Hugging Face or run folder (compressed or not), in eval mode, and a
    description of it for the report."""
    if Path(path).is_dir() and folder_kind(path) == HUGGING_FACE:
        loaded = load_hf_folder(path)
        return loaded.model.eval(), loaded.architecture
    run = load_run(path)
    return run.model.eval(), f"{type(run.model).__name__} ({run.config.model})"


def _positions(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for name in ("max_len", "n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def model_inputs(model: nn.Module, tokens: int) -> dict[str, Any]:
    """A ``[1, tokens]`` batch for ``model``: random token ids (no KV cache), or random
    features for a model of continuous inputs."""
    config: Any = getattr(model, "config", None)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    vocabulary = getattr(config, "vocab_size", None)
    if vocabulary:
        ids = torch.randint(0, vocabulary, (1, tokens), generator=generator).to(device)
        extra = {"use_cache": False} if hasattr(config, "use_cache") else {}
        return {"input_ids": ids, **extra}
    features = torch.randn(1, tokens, int(config.input_dim), generator=generator)
    return {"inputs": features.to(device)}


def pruned_layers(path: str | Path, model: nn.Module) -> tuple[list[str], str]:
    """The weight matrices ``prune`` counts, and where that list came from: the layers of the
    ``pruning.json`` that ``prune --save`` wrote beside the weights (in ``path`` or a folder
    above, for a run's checkpoint), else those ``prune`` would select by default (which leaves
    out the embeddings, the first layer and the LM head)."""
    parameters = dict(model.named_parameters())
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    for candidate in (folder, *list(folder.parents)[:3]):
        try:
            layers = json.loads((candidate / "pruning.json").read_text())["layers"]
            names = [str(layer["name"]) for layer in layers]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if names and all(name in parameters for name in names):
            return names, "as prune counted them (pruning.json)"
    from convergent.sparse import MaskSpec

    return MaskSpec().select(model).names, "as prune selects them by default"


def pruned_sparsity(model: nn.Module, names: Sequence[str]) -> float:
    """The share of zeros over the weight matrices ``names``."""
    parameters = dict(model.named_parameters())
    zeros = sum(int((parameters[name] == 0).sum()) for name in names)
    return zeros / max(sum(parameters[name].numel() for name in names), 1)


@contextlib.contextmanager
def each_warning_once(logger_name: str) -> Iterator[None]:
    """Inside the block, ``logger_name`` says each message once (``bench`` converts the model
    once per length, and a missing sparse format would be said each time)."""
    seen: set[str] = set()

    def first_time(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in seen:
            return False
        seen.add(message)
        return True

    target = logging.getLogger(logger_name)
    target.addFilter(first_time)
    try:
        yield
    finally:
        target.removeFilter(first_time)


def weights_sizes(path: str | Path, model: nn.Module) -> dict[str, Any]:
    """The weights on disk, dense and compressed: the folder's own file for its kind (its
    size on disk), the other computed from the model (the tensors' bytes; a file adds a
    header of a few KiB)."""
    files = weights_files(path)
    compressed = any(file.name.startswith(COMPRESSED_WEIGHTS.split(".")[0]) for file in files)
    _, header = encode_state_dict(model.state_dict(), group_dims(model))
    entries = [entry for entry in header["tensors"].values() if entry["kind"] != "alias"]
    on_disk = sum(file.stat().st_size for file in files)
    dense = sum(entry["dense_bytes"] for entry in entries)
    stored = sum(entry["stored_bytes"] for entry in entries)
    return {
        "files": [file.name for file in files],
        "compressed_file": compressed,
        "dense_bytes": dense if compressed else on_disk,
        "compressed_bytes": on_disk if compressed else stored,
    }


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (None: unchanged)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"{option('threads', threads)} is out of range; it must be >= 1")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _check_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise ValueError(f"{option('device', device)} is not one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"{option('device', 'cuda')} was asked for, but torch sees no CUDA device here"
        )
    return torch.device(device)


def _lengths(model: nn.Module, lengths: Sequence[int]) -> tuple[list[int], list[str]]:
    if not lengths or any(length < 1 for length in lengths):
        raise ValueError(
            f"{option('lengths', ' '.join(map(str, lengths)))} must be one or more token"
            " counts >= 1"
        )
    positions = _positions(model)
    kept = [length for length in lengths if positions is None or length <= positions]
    skipped = [
        f"T = {length} skipped: past the model's {positions} positions"
        for length in lengths
        if length not in kept
    ]
    if not kept:
        raise ValueError(
            f"every length {list(lengths)} is past the model's {positions} positions; pass "
            f"--lengths of at most {positions}"
        )
    return kept, skipped


@torch.no_grad()
def time_lengths(
    model: nn.Module, lengths: Sequence[int], repeats: int = TIMING_REPEATS
) -> list[dict[str, Any]]:
    """Dense against sparse kernels at each length, in this process (see the module)."""
    device = next(model.parameters()).device
    rows = []
    with each_warning_once("convergent.sparse.kernels"):
        for tokens in lengths:
            rows.append(_time_length(model, tokens, device, repeats))
    return rows


def _time_length(
    model: nn.Module, tokens: int, device: torch.device, repeats: int
) -> dict[str, Any]:
    """Dense against sparse kernels at ``tokens`` tokens."""
    sparse = copy.deepcopy(model)
    choices = to_sparse_kernels(sparse, tokens=tokens)
    inputs = model_inputs(model, tokens)
    calls = [functools.partial(model, **inputs), functools.partial(sparse, **inputs)]
    dense, fast = timed_samples(calls, device, repeats)
    dense_seconds, sparse_seconds = min(dense), min(fast)
    switched = choices.converted
    causes: dict[str, int] = {}
    for layer in choices.layers:
        if layer.kernel == "dense":
            causes[layer.cause] = causes.get(layer.cause, 0) + 1
    return {
        "tokens": tokens,
        "dense_seconds": dense_seconds,
        "sparse_seconds": sparse_seconds,
        "speedup": fastest_speedup(dense, fast),
        "dense_tokens_per_second": tokens / dense_seconds,
        "sparse_tokens_per_second": tokens / sparse_seconds,
        "sparse_layers": len(switched),
        "pruned_layers": len(choices.layers),
        # the switched layers alone, each timed by itself: dense over sparse seconds
        "switched_speedup": sum(layer.dense_seconds or 0.0 for layer in switched)
        / sum(layer.sparse_seconds or 0.0 for layer in switched)
        if switched
        else None,
        "dense_causes": causes,
        "kernels": choices.as_dict(),
    }


def _worker_environment() -> dict[str, str]:
    source = str(Path(__file__).resolve().parents[2])  # the folder convergent is imported from
    paths = [source, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def peak_memory(
    path: str | Path, variant: str, threads: int | None, device: str, lengths: Sequence[int]
) -> dict[str, Any]:
    """The peak resident memory of a fresh process that loads ``path``, converts it (for
    ``"sparse"``) and runs one forward at each length: ``{"peak_bytes", "model_bytes"}``
    (``model_bytes``: the peak above the process after its imports), or ``{"error"}``."""
    command = [
        sys.executable, "-m", "convergent.commands.benchmark", "--worker", str(path), variant,
        "--device", device, "--lengths", *map(str, lengths),
        *(["--threads", str(threads)] if threads is not None else []),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=_worker_environment(),
            timeout=WORKER_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the {variant} process ran past {WORKER_TIMEOUT:.0f} s"}
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench(
    path: str | Path,
    *,
    threads: int | None = None,
    device: str = "cpu",
    lengths: Sequence[int] = LENGTHS,
    memory: bool = True,
    generate: int | None = None,
) -> dict[str, Any]:
    """Measure a model folder dense and with sparse kernels (see the module docstring).

    Args:
        path: a Hugging Face folder or a run folder (or checkpoint), compressed or not.
        threads: torch threads (None: torch's current setting).
        device: ``"cpu"`` or ``"cuda"``.
        lengths: the token counts T of the ``[1, T]`` forwards; those past the model's
            positions are skipped, with a note.
        memory: measure peak memory (two fresh processes).
        generate: also time ``model.generate`` of this many new tokens, dense against
            sparse kernels chosen at one token (:mod:`convergent.commands.decode_speed`).

    Returns:
        ``{"source", "model", "device", "threads", "dtype", "sparsity", "sizes", "lengths":
        [per T: dense and sparse seconds, speedup, tokens per second, layers converted],
        "memory": {"dense", "sparse"} or None, "notes"}``.

    Raises:
        ValueError: a device, thread count or length out of range.
    """
    target = _check_device(device)
    with torch_threads(threads):
        model, description = load_for_bench(path)
        model.to(target)
        kept, notes = _lengths(model, lengths)
        layers, counted = pruned_layers(path, model)
        rows = time_lengths(model, kept)
        result: dict[str, Any] = {
            "source": str(path),
            "model": description,
            "device": device,
            "threads": torch.get_num_threads(),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "sparsity": pruned_sparsity(model, layers),
            "sparsity_counts": f"{len(layers)} weight matrices, {counted}",
            "sizes": weights_sizes(path, model),
            "lengths": rows,
            "memory": None,
            "notes": notes,
            "generate": [] if generate is None else [bench_generation(model, generate)],
        }
    if memory:
        result["memory"] = {
            variant: peak_memory(path, variant, threads, device, kept) for variant in VARIANTS
        }
        result["memory_tokens"] = kept[len(kept) // 2]
    return result


def _ratio(sparse: float, dense: float) -> str:
    return f"{sparse / dense:.2f}x" if dense and sparse else ""


def _speed(speedup: float) -> str:
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def format_bench(result: dict[str, Any]) -> str:
    """A table a person reads: one row per measure, dense and sparse kernels side by side."""
    sizes = result["sizes"]
    threads = result["threads"]
    lines = [
        f"{result['source']}: {result['model']}, {result['dtype']}, "
        f"{result['sparsity']:.1%} of the pruned layers' weights zero"
        f" ({result.get('sparsity_counts', 'linear layers')}); {result['device']}, "
        f"{threads} thread{'s' if threads != 1 else ''}",
        "",
    ]
    rows: list[dict[str, Any]] = [
        {
            "measure": "weights (MiB)",
            "dense": f"{sizes['dense_bytes'] / MIB:.2f}",
            "sparse kernels": f"{sizes['compressed_bytes'] / MIB:.2f} compressed"
            + ("" if sizes["compressed_file"] else " (computed)"),
            "sparse / dense": _ratio(sizes["compressed_bytes"], sizes["dense_bytes"]),
        }
    ]
    memory = result.get("memory") or {}
    if memory:
        dense, sparse = memory.get("dense", {}), memory.get("sparse", {})

        def shown(entry: dict[str, Any]) -> str:
            if "error" in entry:
                return "not measured"
            return f"{entry['peak_bytes'] / MIB:.0f} ({entry['model_bytes'] / MIB:.0f} above start)"

        rows.append(
            {
                "measure": "peak memory (MiB)",
                "dense": shown(dense),
                "sparse kernels": shown(sparse),
                "sparse / dense": _ratio(sparse.get("peak_bytes", 0), dense.get("peak_bytes", 0)),
            }
        )
    for row in result["lengths"]:
        tokens = row["tokens"]
        changed = row["sparse_layers"] > 0  # else both columns time the same dense model
        rows.append(
            {
                "measure": f"[1, {tokens}] forward (ms)",
                "dense": f"{row['dense_seconds'] * 1e3:.3f}",
                "sparse kernels": f"{row['sparse_seconds'] * 1e3:.3f}" if changed else "as dense",
                "sparse / dense": _speed(row["speedup"]) if changed else "no layer switched",
            }
        )
    for row in result["lengths"]:
        changed = row["sparse_layers"] > 0
        rows.append(
            {
                "measure": f"tokens/s at T = {row['tokens']}",
                "dense": f"{row['dense_tokens_per_second']:.0f}",
                "sparse kernels": f"{row['sparse_tokens_per_second']:.0f}" if changed else "",
                "sparse / dense": "",
            }
        )
    lines.append(markdown_table(rows))
    lines += [switched_line(row) for row in result["lengths"]]
    lines += [generation_line(row) for row in result.get("generate", [])]
    if memory:
        lines.append(
            "Peak memory: one fresh process per variant loads the model (the sparse one converts"
            f" it at T = {result['memory_tokens']}) and runs one forward at each T; in"
            " parentheses, that peak above the process after its imports."
        )
    for variant, entry in memory.items():
        if "error" in entry:
            lines.append(f"Peak memory of the {variant} variant not measured: {entry['error']}")
    lines += result["notes"]
    return "\n".join(lines) + "\n"


def switched_line(row: dict[str, Any]) -> str:
    """What switched at one length, and the speed-up over those layers only; with none, why
    (no ratio: it would time the same dense model twice)."""
    tokens, switched, pruned = row["tokens"], row["sparse_layers"], row["pruned_layers"]
    if pruned == 0:
        return f"T = {tokens}: no layer switched: no linear layer has zeros, so none was tried."
    causes = row.get("dense_causes") or {}
    why = "; ".join(f"{count} {CAUSES.get(cause, cause)}" for cause, count in causes.items())
    if switched == 0:
        return f"T = {tokens}: no layer switched, so no speed-up is printed ({why})."
    ratio = row.get("switched_speedup")
    over = f", {_speed(ratio)} over those layers, each timed alone" if ratio else ""
    rest = f"; the others dense: {why}" if why else ""
    return f"T = {tokens}: {switched} of {pruned} pruned layers on sparse kernels{over}{rest}."


def resident_bytes() -> int:
    """This process's resident memory now (Linux ``/proc``; elsewhere its peak so far)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@torch.no_grad()
def _worker(arguments: argparse.Namespace) -> int:
    """One variant in a fresh process: load, convert, run each length; print the peak."""
    logging.disable(logging.WARNING)
    start = resident_bytes()
    target = _check_device(arguments.device)
    with torch_threads(arguments.threads):
        model, _ = load_for_bench(arguments.worker[0])
        model.to(target)
        lengths = list(arguments.lengths)
        if arguments.worker[1] == "sparse":
            to_sparse_kernels(model, tokens=lengths[len(lengths) // 2])
        for tokens in lengths:
            model(**model_inputs(model, tokens))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_bytes": peak, "model_bytes": peak - start}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The memory worker's entry point (``python -m convergent.commands.benchmark --worker``)."""
    parser = argparse.ArgumentParser(description="one variant's peak memory (internal)")
    parser.add_argument("--worker", nargs=2, metavar=("PATH", "VARIANT"), required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    return _worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
