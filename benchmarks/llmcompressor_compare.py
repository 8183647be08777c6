"""convergent against llm-compressor, side by side in one run: magnitude, Wanda and SparseGPT at
50 %, 70 % and 2:4, and OWL, on a small Llama and a small GPT-2 trained on austen; and, with
``--models minilm``, Wanda and SparseGPT on the packaged all-MiniLM-L6-v2 sentence encoder.

llm-compressor gets its own virtual environment (it pins transformers <= 5.17; ours is
newer), built on first use in ``--venv`` with torch held at our pinned CPU wheel
(``constraints.txt``'s torch line), and is run there in a subprocess
(``llmcompressor_worker.py``). Our side runs ``convergent.sparse.prune_one_shot`` in a
subprocess of our own environment. Every run is a fresh process, so that its peak resident
memory (sampled every millisecond during the pruning call, minus its value just before) is
its own. For each method and target the two libraries run one after the other, so that the
machine's load is alike for both.

Both libraries read the same files: the same model folder (loaded, and for GPT-2 its
``Conv1D`` layers turned into the equivalent ``nn.Linear``, by ``compare_common.py``), the
same calibration windows (the train split, batches of 16 in the same order), and the same
held-apart evaluation windows (the validation split, no padding), scored by the same function.
Both prune the linear layers of the decoder blocks: the embeddings and the LM head stay dense.

MiniLM (``BertModel``, no head; llm-compressor targets its ``BertLayer`` blocks, we prune every
linear layer but the last, its pooler, which the embeddings do not read): both calibrate on the
same rt-sentences (the train split, 128 sentences padded to 64 tokens with their attention
masks, batches of 16 in the same order) and are scored on 256 held-apart (validation)
sentences by the same function: the mean cosine of the pruned model's pooled, normalised
embeddings (the pooling the folder's sentence-transformers config names) to the dense model's,
taken in the same process before pruning. Only the paired runs (Wanda and SparseGPT) run.

Our side's statistics dtype is the library's default (float64) unless ``--statistics`` says
otherwise (``float32``: the command line's default, as llm-compressor computes them).

    python benchmarks/llmcompressor_compare.py              # trains the models on first use
    python benchmarks/llmcompressor_compare.py --gpt2 runs/gpt2-austen --models llama
    python benchmarks/llmcompressor_compare.py --models minilm --paired-only wanda
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_common import (  # after the path that finds it
    calibration_batches,
    dense_reference,
    load_model,
    load_windows,
    prunable_zeros,
    quality,
)
from resident import PeakResident

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "llmcompressor_worker.py"
BLOCK_CLASSES = {"llama": "LlamaDecoderLayer", "gpt2": "GPT2Block", "minilm": "BertLayer"}
COMPARED = [(m, t) for m in ("magnitude", "wanda", "sparsegpt") for t in ("0.5", "0.7", "2:4")]
OWL_TARGETS = ("0.7", "0.9")
CALIBRATION_BATCH = 16  # llmcompressor_worker.BATCH_SIZE
SENTENCE_TOKENS = 64  # MiniLM's rt-sentences, padded (and truncated) to this many tokens


def ensure_venv(venv: Path) -> Path:
    """llm-compressor's interpreter in ``venv``, installed there first if it is missing."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import llmcompressor"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        print(f"llm-compressor's own virtual environment: {venv} (already built)", flush=True)
        return python
    print(f"building llm-compressor's own virtual environment in {venv} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch only: our other pins (transformers 5.25) are above llm-compressor's cap (<= 5.17)
    torch_pin = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
                 if line.startswith("torch==")]  # fmt: skip
    constraints = venv / "torch-constraint.txt"
    constraints.write_text("\n".join(torch_pin) + "\n")
    pip = [str(python), "-m", "pip", "install", "-c", str(constraints), "llmcompressor"]
    subprocess.run(pip, check=True)
    return python


def ensure_models(
    workdir: Path, gpt2: Path, llama_steps: int, gpt2_steps: int, kinds: list[str]
) -> dict:
    """The folders of the models ``kinds``, trained first where they are missing (MiniLM is
    the packaged all-MiniLM-L6-v2)."""
    llama = workdir / "llama"
    if "llama" in kinds and not (llama / "config.json").exists():
        print(f"training the Llama ({llama_steps} steps) into {llama} ...", flush=True)
        from llama_austen import train

        print(json.dumps(train(llama, llama_steps)), flush=True)
    if "gpt2" in kinds and not (gpt2 / "config.json").exists():
        print(f"training the GPT-2 ({gpt2_steps} steps) into {gpt2} ...", flush=True)
        example = [sys.executable, str(ROOT / "examples" / "gpt2_austen.py")]
        subprocess.run([*example, "--out", str(gpt2), "--steps", str(gpt2_steps)], check=True)
    folders = {"llama": llama, "gpt2": gpt2}
    if "minilm" in kinds:
        from convergent.data import minilm_path

        folders["minilm"] = minilm_path()
    return folders


def evenly_spaced(rows: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` rows spread over all of ``rows`` (every novel, not the first one's start)."""
    step = max(len(rows) // count, 1)
    return rows[::step][:count].contiguous()


def write_windows(kind: str, folder: Path, path: Path, calibration: int, evaluation: int) -> None:
    """The calibration (train split) and evaluation (validation split) windows of ``kind``,
    as token ids without padding (MiniLM: rt-sentences padded to ``SENTENCE_TOKENS``, with
    their attention masks and the folder's pooling), to ``path``."""
    from convergent.data import load_splits

    if kind == "minilm":
        from transformers import AutoTokenizer

        from convergent.commands.sentence_embeddings import pooling_mode

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        tokenizer.padding_side = "right"
        splits = load_splits("rt-sentences", seed=0, tokenizer=tokenizer,
                             max_length=SENTENCE_TOKENS)  # fmt: skip
        train, held = splits.train.tensors, splits.validation.tensors
        sentences = {
            "calibration": evenly_spaced(train["input_ids"], calibration),
            "calibration_mask": evenly_spaced(train["attention_mask"], calibration),
            "evaluation": evenly_spaced(held["input_ids"], evaluation),
            "evaluation_mask": evenly_spaced(held["attention_mask"], evaluation),
            "pooling": pooling_mode(folder),
        }
        torch.save(sentences, path)
        return
    if kind == "llama":  # the austen characters themselves
        splits = load_splits("austen", seed=0, seq_len=128)
        train, validation = (s.tensors["input_ids"] for s in (splits.train, splits.validation))
    else:  # character windows as text, WordPiece-tokenized; only windows that fill 48 tokens
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        splits = load_splits("austen", seed=0, seq_len=256)
        itos = splits.info["itos"]

        def tokens(split: Any) -> torch.Tensor:
            texts = ["".join(itos[i] for i in row) for row in split.tensors["input_ids"].tolist()]
            encoded = tokenizer(texts, max_length=48, truncation=True, padding="max_length",
                                return_tensors="pt")  # fmt: skip
            full = encoded["attention_mask"].all(dim=1)
            return encoded["input_ids"][full]

        train, validation = tokens(splits.train), tokens(splits.validation)
    windows = {
        "calibration": evenly_spaced(train, calibration),
        "evaluation": evenly_spaced(validation, evaluation),
    }
    torch.save(windows, path)


def measure_ours(folder: str, windows_path: str, method: str, target: str, distribution: str,
                 statistics: str) -> dict[str, Any]:  # fmt: skip
    """Our side of one run, in this process: ``prune_one_shot`` timed, then scored."""
    from convergent.sparse import MaskSpec, prune_one_shot

    torch.manual_seed(0)
    model = load_model(folder)
    windows = load_windows(windows_path)
    reference = dense_reference(model, windows)
    row: dict[str, Any] = {"library": "convergent", "method": method, "target": target}
    row["distribution"] = distribution
    row["threads"] = torch.get_num_threads()
    if target != "dense":
        n_m = target == "2:4"
        spec = MaskSpec(distribution=distribution, pattern="2:4" if n_m else "unstructured")
        needs_data = method != "magnitude" or distribution == "owl"
        calibration = calibration_batches(windows, CALIBRATION_BATCH) if needs_data else None
        options = {"statistics": statistics} if method != "magnitude" else None
        row["statistics"] = statistics
        with PeakResident() as memory:
            start, cpu_start = time.perf_counter(), time.process_time()
            prune_one_shot(model, 0.5 if n_m else float(target), spec=spec, method=method,
                           calibration=calibration, options=options)  # fmt: skip
            row["seconds"] = time.perf_counter() - start
            row["cpu seconds"] = time.process_time() - cpu_start
        row["peak MiB"] = memory.above_start
        zeros, entries = prunable_zeros(model)
        row["sparsity"] = zeros / max(entries, 1)
        row["entries"] = entries
    row.update(quality(model, windows, reference))
    return row


Job = tuple[dict[str, str], list[str]]  # what runs (library, method, ...), its command


def jobs_of(
    kind: str,
    folder: Path,
    windows: Path,
    venv_python: Path,
    first: bool,
    paired_only: list[str] | None,
    statistics: str = "float64",
    threads: int = 2,
) -> list[Job]:
    """The runs of one model, each library's run of a method and target next to the other's
    (``paired_only``: only those pairs, of these methods; an empty list: Wanda and SparseGPT;
    MiniLM: only pairs, whatever it says)."""
    common = [str(folder), str(windows)]
    if kind == "minilm" and paired_only is None:
        paired_only = []

    def ours(method: str, target: str, distribution: str = "uniform") -> Job:
        what = {"library": "convergent", "method": method, "target": target,
                "distribution": distribution}  # fmt: skip
        command = [sys.executable, __file__, "--ours", *common, method, target, distribution]
        return what, [*command, statistics, "--threads", str(threads)]

    def theirs(method: str, target: str, distribution: str = "uniform") -> Job:
        what = {"library": "llm-compressor", "method": method, "target": target,
                "distribution": distribution}  # fmt: skip
        owl = ["--owl"] if distribution == "owl" else []
        block = BLOCK_CLASSES[kind]
        worker = [str(venv_python), str(WORKER), *common, method, target, block, *owl]
        return what, [*worker, "--threads", str(threads)]

    if paired_only is not None:
        methods = paired_only or ["wanda", "sparsegpt"]
        return [job(m, t) for m, t in COMPARED if m in methods for job in (ours, theirs)]
    jobs = [ours("magnitude", "dense")]
    for method, target in COMPARED:
        jobs.append(ours(method, target))
        if method != "magnitude":  # llm-compressor's magnitude is for training (README)
            jobs.append(theirs(method, target))
    if first:  # whether llm-compressor's OWL runs yet: one try is enough
        jobs.append(theirs("wanda", "0.7", "owl"))
    for method in ("wanda", "sparsegpt"):
        for target in OWL_TARGETS:
            jobs.append(ours(method, target, "owl"))
        jobs.append(ours(method, "0.9"))
    return jobs


def run(command: list[str]) -> dict[str, Any]:
    """One child process's JSON line (or its failure, reported as a row)."""
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {done.returncode}: {tail[0]}"}
    return json.loads(lines[-1])


def fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of ``runs`` of the same job: the first, with the fewest wall and CPU seconds
    over all of them (each its own minimum) and every run's ``[wall, CPU]`` seconds."""
    timed = [r for r in runs if "seconds" in r and "error" not in r]
    if len(runs) == 1 or not timed:
        return runs[0]
    row = dict(timed[0])
    row["seconds"] = min(r["seconds"] for r in timed)
    row["cpu seconds"] = min(r["cpu seconds"] for r in timed)
    row["runs"] = [[r["seconds"], r["cpu seconds"]] for r in timed]
    return row


def in_pairs(jobs: list[Job]) -> list[list[Job]]:
    """The jobs grouped by method, target and distribution: a pair where both libraries run
    it, one job where only ours does."""
    groups: list[list[Job]] = []
    for job in jobs:
        key = [job[0][k] for k in ("method", "target", "distribution")]
        if groups and [groups[-1][-1][0][k] for k in ("method", "target", "distribution")] == key:
            groups[-1].append(job)
        else:
            groups.append([job])
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("runs/llmcompressor-compare"))
    parser.add_argument("--venv", type=Path, default=Path("runs/llmcompressor-venv"))
    parser.add_argument("--gpt2", type=Path, help="an examples/gpt2_austen.py folder")
    parser.add_argument("--models", nargs="+", default=["llama", "gpt2"], choices=BLOCK_CLASSES)
    parser.add_argument("--llama-steps", type=int, default=40)
    parser.add_argument("--gpt2-steps", type=int, default=120)
    parser.add_argument("--calibration", type=int, default=128, help="calibration windows")
    parser.add_argument("--evaluation", type=int, default=256, help="evaluation windows")
    parser.add_argument(
        "--paired-only",
        nargs="*",
        choices=("wanda", "sparsegpt"),
        help="run only these methods' pairs again (none named: both); their rows replace the"
        " earlier ones in results.jsonl",
    )
    parser.add_argument(
        "--statistics",
        choices=("float64", "float32"),
        default="float64",
        help="our Wanda's and SparseGPT's statistics dtype (default float64, the library's;"
        " float32 is the command line's default and llm-compressor's)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run each pair this many times, the two libraries alternating, and keep each"
        " one's fewest seconds (on a machine shared with other jobs the fastest run is the"
        " least disturbed one); every run's seconds are kept in the row",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads of every run, both libraries (default 2; 1 keeps the CPU seconds"
        " of a machine shared with other jobs free of threads spinning while they wait)",
    )
    parser.add_argument("--ours", nargs=6, help=argparse.SUPPRESS)  # a child process
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    if arguments.ours:
        print(json.dumps(measure_ours(*arguments.ours)))
        return
    started = time.perf_counter()
    workdir = arguments.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    venv_python = ensure_venv(arguments.venv)
    gpt2 = arguments.gpt2 or workdir / "gpt2-austen"
    folders = ensure_models(
        workdir, gpt2, arguments.llama_steps, arguments.gpt2_steps, arguments.models
    )
    results = workdir / "results.jsonl"  # appended to; a later row replaces an earlier one
    for kind in arguments.models:
        folder, windows = folders[kind], workdir / f"{kind}-windows.pt"
        write_windows(kind, folder, windows, arguments.calibration, arguments.evaluation)
        first = kind == arguments.models[0]
        jobs = jobs_of(kind, folder, windows, venv_python, first, arguments.paired_only,
                       arguments.statistics, arguments.threads)  # fmt: skip
        for group in in_pairs(jobs):
            runs: list[list[dict[str, Any]]] = [[] for _ in group]
            for _ in range(arguments.repeats):
                for index, job in enumerate(group):
                    runs[index].append(run(job[1]))
            for job, done in zip(group, runs, strict=True):
                row = {"model": kind, **job[0], **fastest(done)}
                with results.open("a") as file:
                    file.write(json.dumps(row) + "\n")
                print(f"[{time.perf_counter() - started:6.0f} s] {json.dumps(row)}", flush=True)
    from llmcompressor_table import tables

    # every row of the file: a run of one model adds to an earlier run of the other
    text = tables([json.loads(line) for line in results.read_text().splitlines() if line])
    (workdir / "table.md").write_text(text + "\n")
    print(text)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
