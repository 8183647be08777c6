"""``convergent diagnose`` on the command line: its flags, the report folder's default, and
:func:`~convergent.commands.diagnose.diagnose` run."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``diagnose`` and its flags to ``commands``."""
    parser = commands.add_parser(
        "diagnose",
        help="convergence diagnostics of a run, a checkpoint, a Hugging Face model folder or"
        " MiniLM: a report folder",
        description="Write a markdown summary and PNG plots: layer-wise loss, attention-output"
        " spectra per layer, rank collapse, weight histograms and sparsity, W_Q/W_K norms.",
    )
    parser.add_argument(
        "path",
        help="a run folder, its checkpoints folder, a checkpoint, a save_pretrained folder,"
        " or 'minilm'",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="the data source to diagnose on (default: a run's own; for a Hugging Face folder "
        "the data prune scored it on, else austen for a causal LM, rt-sentences for a "
        "classifier; minilm needs one)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the report folder to write (default: a new folder beside the model, named"
        " after it: MODEL-diagnostics, MODEL-diagnostics-2, ...; never inside it)",
    )
    parser.add_argument("--examples", type=int, default=64, help="examples in the diagnostic batch")
    parser.add_argument(
        "--seed", type=int, default=None, help="seeds the data's split (default: the run's own)"
    )
    parser.add_argument("--max-length", type=int, default=64, help="tokens per text example")
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    """``convergent diagnose``'s parsed flags: do the command; returns the exit status."""
    from convergent.commands.diagnose import diagnose

    out = arguments.out
    if out is None:
        out = default_report_folder(arguments.path, arguments.data)
    summary = diagnose(
        arguments.path,
        arguments.data,
        out,
        examples=arguments.examples,
        seed=arguments.seed,
        max_length=arguments.max_length,
    )
    print(f"diagnostics: {summary}")
    return 0


def default_report_folder(path: str, data: str | None) -> Path:
    """Where ``diagnose`` writes when ``--out`` is not given: a new folder beside the model (or
    run), named after it, so that the model's own folder is never written into."""
    if path == "minilm":
        name = (data or "").replace(":", "-").replace("/", "_")
        return Path(f"diagnostics-minilm-{name}")
    model = Path(path).resolve()
    candidate = model.parent / f"{model.name}-diagnostics"
    number = 2
    while candidate.exists():
        candidate = model.parent / f"{model.name}-diagnostics-{number}"
        number += 1
    return candidate
