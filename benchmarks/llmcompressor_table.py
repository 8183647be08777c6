"""The markdown tables of ``llmcompressor_compare.py``, from its rows (``results.jsonl``).

python benchmarks/llmcompressor_table.py runs/llmcompressor-compare/results.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PERPLEXITY_TOLERANCE = 1.01  # ours at most 1 % above llm-compressor's
LABELS = {"0.5": "50 %", "0.7": "70 %", "0.9": "90 %", "2:4": "2:4", "dense": "dense"}


def _find(rows: list[dict[str, Any]], **keys: str) -> dict[str, Any] | None:
    found = [r for r in rows if all(r.get(k) == v for k, v in keys.items())]
    return found[-1] if found else None


def _number(row: dict[str, Any] | None, key: str, digits: int) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "error"
    value = row.get(key)
    return "-" if value is None else f"{value:.{digits}f}"


def _seconds(row: dict[str, Any] | None) -> str:
    """Wall seconds, with the process's CPU seconds in brackets where recorded."""
    wall = _number(row, "seconds", 1)
    if row is None or "cpu seconds" not in row:
        return wall
    return f"{wall} ({row['cpu seconds']:.1f})"


def comparison(rows: list[dict[str, Any]], model: str) -> list[str]:
    """One line per method and target: both libraries' perplexity, seconds, peak memory.

    The time target is judged on CPU seconds where both runs recorded them (on a machine
    shared with other jobs, wall time measures the neighbours as much as the code)."""
    lines = []
    dense = _find(rows, model=model, target="dense")
    lines.append(f"| {model} | dense | | {_number(dense, 'perplexity', 2)} | | | | | | | | |")
    for method in ("magnitude", "wanda", "sparsegpt"):
        for target in ("0.5", "0.7", "2:4"):
            keys = {"model": model, "method": method, "target": target, "distribution": "uniform"}
            ours = _find(rows, library="convergent", **keys)
            theirs = _find(rows, library="llm-compressor", **keys)
            ratios, met = "| ", ""
            if ours and theirs and "error" not in ours and "error" not in theirs:
                perplexity_ratio = ours["perplexity"] / theirs["perplexity"]
                wall_ratio = ours["seconds"] / theirs["seconds"]
                time_ratio, time_text = wall_ratio, f"{wall_ratio:.2f}"
                if "cpu seconds" in ours and "cpu seconds" in theirs:
                    time_ratio = ours["cpu seconds"] / theirs["cpu seconds"]
                    time_text += f" ({time_ratio:.2f})"
                ratios = f"{perplexity_ratio:.4f} | {time_text}"
                good = perplexity_ratio <= PERPLEXITY_TOLERANCE, time_ratio <= 1.0
                met = " / ".join("yes" if g else "no" for g in good)
            lines.append(
                f"| {model} | {method} | {LABELS[target]} | {_number(ours, 'perplexity', 2)} | "
                f"{_number(theirs, 'perplexity', 2)} | {ratios} | {_seconds(ours)} | "
                f"{_seconds(theirs)} | {_number(ours, 'peak MiB', 0)} | "
                f"{_number(theirs, 'peak MiB', 0)} | {met} |"
            )
    return lines


def time_ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[float, str]:
    """Ours over theirs: CPU seconds where both recorded them, else wall; and its text (wall,
    then CPU in brackets)."""
    wall = ours["seconds"] / theirs["seconds"]
    if "cpu seconds" in ours and "cpu seconds" in theirs:
        cpu = ours["cpu seconds"] / theirs["cpu seconds"]
        return cpu, f"{wall:.2f} ({cpu:.2f})"
    return wall, f"{wall:.2f}"


def embedding_lines(rows: list[dict[str, Any]], model: str) -> list[str]:
    """A sentence encoder's pairs: both libraries' mean cosine to the dense embeddings, time
    and peak memory."""
    lines = []
    for method in ("wanda", "sparsegpt"):
        for target in ("0.5", "0.7", "2:4"):
            keys = {"model": model, "method": method, "target": target, "distribution": "uniform"}
            ours = _find(rows, library="convergent", **keys)
            theirs = _find(rows, library="llm-compressor", **keys)
            if ours is None and theirs is None:
                continue
            difference, ratio = "", ""
            if ours and theirs and "cosine" in ours and "cosine" in theirs:
                difference = f"{ours['cosine'] - theirs['cosine']:+.2e}"
                ratio = time_ratio(ours, theirs)[1]
            lines.append(
                f"| {model} | {method} | {LABELS[target]} | {_number(ours, 'cosine', 6)} | "
                f"{_number(theirs, 'cosine', 6)} | {difference} | {ratio} | {_seconds(ours)} | "
                f"{_seconds(theirs)} | {_number(ours, 'peak MiB', 0)} | "
                f"{_number(theirs, 'peak MiB', 0)} |"
            )
    return lines


def owl_lines(rows: list[dict[str, Any]], model: str) -> list[str]:
    """Our OWL against our uniform allocation, per method and target."""
    lines = []
    for method in ("wanda", "sparsegpt"):
        for target in ("0.7", "0.9"):
            keys = {"model": model, "library": "convergent", "method": method, "target": target}
            uniform = _find(rows, distribution="uniform", **keys)
            owl = _find(rows, distribution="owl", **keys)
            ratio = "-"
            if uniform and owl and "perplexity" in uniform and "perplexity" in owl:
                ratio = f"{owl['perplexity'] / uniform['perplexity']:.3f}"
            lines.append(
                f"| {model} | {method} | {LABELS[target]} | {_number(uniform, 'perplexity', 2)} | "
                f"{_number(owl, 'perplexity', 2)} | {ratio} | {_number(uniform, 'seconds', 1)} | "
                f"{_number(owl, 'seconds', 1)} |"
            )
    return lines


def tables(rows: list[dict[str, Any]]) -> str:
    """Both tables (and a sentence encoder's), and llm-compressor's OWL error if it raised
    one."""
    encoders = list(dict.fromkeys(r["model"] for r in rows if "cosine" in r))
    models = [m for m in dict.fromkeys(r["model"] for r in rows) if m not in encoders]
    text = [
        "| model | method | target | ours ppl | llm-compressor ppl | ppl ratio |"
        " time ratio (CPU) | ours s (CPU s) | llm-compressor s (CPU s) | ours peak MiB |"
        " llm-compressor peak MiB | ppl / time met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in models:
        text += comparison(rows, model)
    text += [
        "",
        "| model | method | target | uniform ppl | OWL ppl | OWL / uniform | uniform s | OWL s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in models:
        text += owl_lines(rows, model)
    if encoders:
        text += [
            "",
            "| model | method | target | ours cosine | llm-compressor cosine | ours - theirs |"
            " time ratio (CPU) | ours s (CPU s) | llm-compressor s (CPU s) | ours peak MiB |"
            " llm-compressor peak MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for model in encoders:
            text += embedding_lines(rows, model)
    for row in rows:
        if row.get("library") == "convergent" and "error" in row:
            what = f"{row['model']}, {row['method']}, {row['distribution']} {row['target']}"
            text += ["", f"ours ({what}): {row['error']}"]
        if row.get("library") == "llm-compressor" and row.get("distribution") == "owl":
            text += ["", f"llm-compressor's OWL ({row['model']}, {row['method']}): "
                     f"{row.get('error', 'ran')}"]  # fmt: skip
    return "\n".join(text)


if __name__ == "__main__":
    lines = Path(sys.argv[1]).read_text().splitlines()
    print(tables([json.loads(line) for line in lines if line.strip()]))
