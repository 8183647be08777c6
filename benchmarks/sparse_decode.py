"""Token-by-token generation, dense against sparse kernels, on Llama-style models built from a
config (random weights): tokens per second of ``model.generate`` (greedy, KV cache, batch 1,
a 32-token prompt, 64 new tokens), beside the bytes of weight each token reads.

For each d_model, dtype, thread count and setting, the decoder's linear layers are pruned
Wanda-like (each row keeps its largest magnitudes, the same count in every row; 2:4 keeps
two of every four inputs), then the same pruned model is timed dense and after
``to_sparse_kernels(model, tokens=1)`` (each layer on the fastest of dense, CSR, BSR and the
decode kernel, timed at one token), samples taken in turn in one process, the fastest of
``--repeats`` each. The limit of the speed-up is the ratio of bytes read per token; the
table prints the speed-up's share of it. Generated ids are compared with the dense model's.

    python benchmarks/sparse_decode.py                       # the table in benchmarks/README.md
    python benchmarks/sparse_decode.py --sizes 1024 --dtypes float32 --threads 1
    python benchmarks/sparse_decode.py --sizes 1024 --threads 1 --profile   # where a step goes

``--profile`` splits one decoding step's thread CPU time (not wall time: the shared machine's
other jobs deschedule this one, which CPU time does not count) into the decoder's linear
layers, the head and the rest (attention, norms, rotary, ``generate``'s own work), dense and
with every decoder layer on the decode kernel, and prints the Amdahl bounds: the whole step's
speed-up were the linear layers infinitely fast, or as fast as their bytes allow.

``--compile`` gives both models a static KV cache and ``torch.compile(model.forward,
dynamic=False)`` (the decode kernel is one operator in the graph), compiled and warmed before
any timed sample, and adds: each step's thread CPU time with the prompt's prefill left out
(compiled dense, compiled sparse, eager dense, in turn), the compiled sparse model against the
eager dense one (what a user gains over an eager run), and dynamo's graph breaks.

    python benchmarks/sparse_decode.py --sizes 1024 --dtypes float32 --threads 1 --compile

Targets (d_model 1024, float32, one thread): 1.3x dense at 50 %, 2x at 70 %, 3.5x at 90 %.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convergent.commands.decode_speed import time_generation
from convergent.report import markdown_table
from convergent.sparse import n_m_mask
from convergent.sparse.kernels import to_sparse_kernels

SETTINGS = {"50%": 0.5, "70%": 0.7, "90%": 0.9, "2:4": None}
TARGETS = {"50%": 1.3, "70%": 2.0, "90%": 3.5}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MIB = 2**20


def llama(d_model: int, layers: int, vocabulary: int) -> nn.Module:
    """A Llama-style causal LM with random weights: d_ff = 2.75 d_model, 64-wide heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=d_model,
        intermediate_size=int(2.75 * d_model),
        num_hidden_layers=layers,
        num_attention_heads=d_model // 64,
        num_key_value_heads=d_model // 64,
        vocab_size=vocabulary,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def prune_rows(model: nn.Module, setting: str) -> None:
    """Prune every decoder linear layer in place: each row keeps the same count of its largest
    magnitudes (``SETTINGS[setting]`` of them zeroed), or 2:4 along the inputs."""
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or name == "lm_head":
            continue
        weight = module.weight
        sparsity = SETTINGS[setting]
        if sparsity is None:
            mask = n_m_mask(weight, 2, 4)
        else:
            keep = weight.shape[1] - round(sparsity * weight.shape[1])
            top = weight.abs().topk(keep, dim=1).indices
            mask = torch.zeros_like(weight, dtype=torch.bool).scatter_(1, top, True)
        weight.masked_fill_(~mask, 0.0)


def compile_forward(model: nn.Module) -> None:
    """Give ``model`` a static KV cache and a compiled forward (``dynamic=False``), in place."""
    model.generation_config.cache_implementation = "static"  # type: ignore[union-attr]
    model.forward = torch.compile(model.forward, dynamic=False)  # type: ignore[method-assign]


def measure(
    model: nn.Module, threads: int, repeats: int, new_tokens: int, compiled: bool = False
) -> dict[str, Any]:
    """The pruned ``model`` dense against its sparse-kernel copy, on ``threads`` threads;
    ``compiled``: both under :func:`compile_forward`, compiled before the timed samples, and
    the compiled sparse model also timed against the eager dense one (``eager_*`` keys)."""
    from convergent.commands.decode_speed import generate_tokens, prompt_ids

    torch.set_num_threads(threads)
    sparse = copy.deepcopy(model)
    report = to_sparse_kernels(sparse, tokens=1)  # chosen by eager timings
    eager = model
    if compiled:
        torch._dynamo.reset()  # one model pair's graphs at a time: no recompile limit reached
        model = copy.deepcopy(model)
        for candidate in (model, sparse):
            compile_forward(candidate)
            for _ in range(2):  # compiles the prefill's and a step's graphs, then runs them
                generate_tokens(candidate, prompt_ids(candidate), new_tokens)
    result = time_generation(model, sparse, new_tokens=new_tokens, repeats=repeats)
    if compiled:
        models = {"dense": model, "sparse": sparse, "eager dense": eager}
        result["step_ms"] = step_milliseconds(models, new_tokens, repeats)
        breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
        result["graph_breaks"] = breaks
        over_eager = time_generation(eager, sparse, new_tokens=new_tokens, repeats=repeats)
        result["eager_dense_tokens_per_second"] = over_eager["dense_tokens_per_second"]
        result["speedup_over_eager"] = over_eager["speedup"]
        result["same_tokens_as_eager"] = over_eager["same_tokens"]
    kernels = sorted({layer.kernel for layer in report.converted})
    result["switched"] = f"{len(report.converted)} of {len(report.layers)}"
    result["kernels"] = ", ".join(kernels) or "none"
    return result


def step_milliseconds(
    models: dict[str, nn.Module], new_tokens: int, repeats: int
) -> dict[str, float]:
    """Thread CPU milliseconds of one decoding step of each model, the prompt's prefill left
    out: a run of ``new_tokens`` less a run of 1, over ``new_tokens - 1`` (no longer than the
    warm-up's, so a static cache keeps its shape); models in turn, the least of ``repeats``.
    Raises on a recompile (a compiled model timed off its graphs)."""
    from convergent.commands.decode_speed import generate_tokens, prompt_ids

    best = dict.fromkeys(models, float("inf"))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(repeats):
            for name, model in models.items():
                prompt, spent = prompt_ids(model), []
                for tokens in (new_tokens, 1):
                    start = time.thread_time()
                    generate_tokens(model, prompt, tokens)
                    spent.append(time.thread_time() - start)
                step = (spent[0] - spent[1]) / (new_tokens - 1) * 1e3
                best[name] = min(best[name], step)
    return best


def _timed_calls(model: nn.Module, spent: dict[str, float]) -> list[Callable[[], None]]:
    """Wrap each linear module's forward to add its thread CPU seconds to ``spent`` under
    ``"head"`` or ``"linears"``; returns the calls that undo it."""
    undo = []
    for name, module in model.named_modules():
        if not (isinstance(module, nn.Linear) or hasattr(module, "stored_bytes")):
            continue
        key, forward = ("head" if name == "lm_head" else "linears"), module.forward

        def timed(x: torch.Tensor, forward: Any = forward, key: str = key) -> Any:
            start = time.thread_time()
            result = forward(x)
            spent[key] += time.thread_time() - start
            return result

        module.forward = timed  # type: ignore[method-assign]
        undo.append(lambda module=module: delattr(module, "forward"))
    return undo


@torch.no_grad()
def profile_step(model: nn.Module, repeats: int, new_tokens: int) -> dict[str, Any]:
    """One decoding step's thread CPU milliseconds, split (module docstring), dense against
    every decoder linear layer on the decode kernel; the fastest of ``repeats``, in turn."""
    from convergent.commands.decode_speed import generate_tokens, prompt_ids, weight_bytes_per_token
    from convergent.sparse.decode_kernels import IndexedLinear

    torch.set_num_threads(1)
    sparse = copy.deepcopy(model)
    for name, module in list(sparse.named_modules()):
        if isinstance(module, nn.Linear) and name != "lm_head":
            parent, _, child = name.rpartition(".")
            setattr(sparse.get_submodule(parent), child, IndexedLinear(module.weight, module.bias))
    prompt = prompt_ids(model)
    steps: dict[str, dict[str, float]] = {}
    for candidate in (model, sparse):  # numba loads its compiled loops on a first call
        generate_tokens(candidate, prompt, 2)
    for _ in range(repeats):
        for label, candidate in (("dense", model), ("sparse", sparse)):
            spent = {"head": 0.0, "linears": 0.0}
            undo = _timed_calls(candidate, spent)
            totals = []
            for tokens in (1, new_tokens + 1):  # the prompt's prefill and first token, then more
                before = dict(spent)
                start = time.thread_time()
                generate_tokens(candidate, prompt, tokens)
                totals.append({"step": time.thread_time() - start, **spent})
                totals[-1] = {
                    key: value - before.get(key, 0.0) for key, value in totals[-1].items()
                }
            for call in undo:
                call()
            step = {key: (totals[1][key] - totals[0][key]) / new_tokens * 1e3 for key in totals[0]}
            step["rest"] = step["step"] - step["linears"] - step["head"]
            if label not in steps or step["step"] < steps[label]["step"]:
                steps[label] = step
    dense, sparse_step = steps["dense"], steps["sparse"]
    fixed = sparse_step["rest"] + sparse_step["head"]
    head_bytes = model.get_submodule("lm_head").weight.numel() * model.dtype.itemsize
    limit = (weight_bytes_per_token(model) - head_bytes) / (
        weight_bytes_per_token(sparse) - head_bytes
    )
    return {
        **{f"dense {key} ms": f"{value:.1f}" for key, value in dense.items()},
        **{f"sparse {key} ms": f"{value:.1f}" for key, value in sparse_step.items()},
        "linears speed-up": f"{dense['linears'] / sparse_step['linears']:.2f}x",
        "linears bytes limit": f"{limit:.2f}x",
        "step speed-up": f"{dense['step'] / sparse_step['step']:.2f}x",
        "bound at the bytes limit": f"{dense['step'] / (fixed + dense['linears'] / limit):.2f}x",
        "bound, linears free": f"{dense['step'] / fixed:.2f}x",
    }


def compiled_columns(result: dict[str, Any]) -> dict[str, str]:
    """The ``--compile`` row's extra cells: the compiled sparse model against the eager dense
    one (what a user gains over an eager run), and the graph breaks dynamo counted."""
    step = result["step_ms"]
    return {
        "step ms dense / sparse (CPU)": f"{step['dense']:.1f} / {step['sparse']:.1f}",
        "step speed-up (CPU)": f"{step['dense'] / step['sparse']:.2f}x",
        "eager dense step ms (CPU)": f"{step['eager dense']:.1f}",
        "step over eager dense (CPU)": f"{step['eager dense'] / step['sparse']:.2f}x",
        "eager dense tok/s": f"{result['eager_dense_tokens_per_second']:.1f}",
        "compiled sparse over eager dense": f"{result['speedup_over_eager']:.2f}x",
        "same tokens as eager": "yes" if result["same_tokens_as_eager"] else "no",
        "graph breaks": str(result["graph_breaks"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, torch.get_num_threads()])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocabulary", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="split a step (docstring)")
    parser.add_argument("--compile", action="store_true", help="static cache, compiled forward")
    arguments = parser.parse_args()
    rows = []
    start = time.perf_counter()
    for size in arguments.sizes:
        base = llama(size, arguments.layers, arguments.vocabulary)
        for dtype_name in arguments.dtypes:
            for setting in arguments.settings:
                model = copy.deepcopy(base).to(DTYPES[dtype_name])
                prune_rows(model, setting)
                if arguments.profile and setting in TARGETS:
                    split = profile_step(model, arguments.repeats, arguments.new_tokens)
                    rows.append({"d_model": size, "dtype": dtype_name, "setting": setting, **split})
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                for threads in dict.fromkeys(arguments.threads):
                    result = measure(
                        model, threads, arguments.repeats, arguments.new_tokens, arguments.compile
                    )
                    target = TARGETS.get(setting) if size == 1024 and threads == 1 else None
                    if dtype_name != "float32":
                        target = None
                    # no layer switched: the model is the dense one, so a ratio would be noise
                    same = result["switched"].startswith("0 of")
                    row = {
                        "d_model": size,
                        "dtype": dtype_name,
                        "threads": threads,
                        "setting": setting,
                        "dense tok/s": f"{result['dense_tokens_per_second']:.1f}",
                        "sparse tok/s": f"{result['sparse_tokens_per_second']:.1f}",
                        "speed-up": "as dense" if same else f"{result['speedup']:.2f}x",
                        "MiB/token dense": f"{result['dense_bytes_per_token'] / MIB:.1f}",
                        "MiB/token sparse": f"{result['sparse_bytes_per_token'] / MIB:.1f}",
                        "limit": f"{result['memory_limit']:.2f}x",
                        "share of limit": "" if same else f"{result['share_of_limit']:.0%}",
                        "layers switched": f"{result['switched']} ({result['kernels']})",
                        "same tokens": "yes" if result["same_tokens"] else "no",
                        **(compiled_columns(result) if arguments.compile else {}),
                        "target": f">= {target}x: not met (stays dense)"
                        if target and same
                        else f">= {target}x: {'met' if result['speedup'] >= target else 'not met'}"
                        if target
                        else "",
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del model
    print()
    print(markdown_table(rows))
    print(f"\n{time.perf_counter() - start:.0f} s in all")
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
