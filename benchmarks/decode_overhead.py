"""How much of a batch-1 decoding step is not the linear layers, eager and under torch.compile.

The decode kernels can only shrink the linear layers' share of a token's time; the rest
(attention over the KV cache, norms, rotary, ``generate``'s own work) bounds the whole step's
speed-up. This script measures, in thread CPU time on one thread (a decoding step without
the prompt's prefill), for the d_model 1024
Llama-style model of ``sparse_decode.py`` (dense): every linear layer's ``[1, in]`` product
alone, then a greedy ``generate`` step eagerly (dynamic and static KV cache) and with
``model.forward`` compiled (static cache), and prints the bound each leaves for 50, 70 and 90 %.

    python benchmarks/decode_overhead.py
"""

from __future__ import annotations

import time

import torch
from sparse_decode import llama

NEW_TOKENS = 32
# the linear layers' bytes ratio at each sparsity (benchmarks/README.md: ELL, head dense)
LINEAR_LIMITS = {"50%": 1.0, "70%": 2.01, "90%": 4.68}


def per_token(
    model: torch.nn.Module, prompt: torch.Tensor, repeats: int = 3
) -> tuple[float, torch.Tensor]:
    """Thread CPU seconds per decoding step, the prompt's prefill left out (a run of
    ``NEW_TOKENS + 1`` tokens less a run of 1, over ``NEW_TOKENS``; the least of ``repeats``),
    and the ids generated."""

    def run(tokens: int) -> tuple[float, torch.Tensor]:
        start = time.thread_time()
        ids = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False)  # fmt: skip
        return time.thread_time() - start, ids

    best, ids = float("inf"), prompt
    for _ in range(repeats):
        (long, ids), (short, _) = run(NEW_TOKENS + 1), run(1)
        best = min(best, (long - short) / NEW_TOKENS)
    return best, ids


@torch.no_grad()
def linears_alone(model: torch.nn.Module, repeats: int = 10) -> float:
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(1, m.in_features) for m in layers}
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        for _ in range(repeats):
            for layer in layers:
                layer(inputs[layer.in_features])
        best = min(best, (time.thread_time() - start) / repeats)
    return best


def main() -> None:
    torch.set_num_threads(1)
    model = llama(1024, 8, 8192)
    prompt = torch.randint(0, 8192, (1, 32))
    linear = linears_alone(model)
    eager, eager_ids = per_token(model, prompt)
    model.generation_config.cache_implementation = "static"
    static, _ = per_token(model, prompt)
    model.forward = torch.compile(model.forward, dynamic=False)
    per_token(model, prompt, repeats=1)  # compiles
    compiled, compiled_ids = per_token(model, prompt)
    print(f"linear layers alone: {linear * 1e3:.1f} ms CPU per token")
    for name, step in (("eager", eager), ("eager, static cache", static), ("compiled", compiled)):
        rest = max(step - linear, 0.0)
        bounds = ", ".join(
            f"{k} {step / (rest + linear / v):.2f}x" for k, v in LINEAR_LIMITS.items()
        )
        print(f"{name}: {step * 1e3:.1f} ms a token, {rest * 1e3:.1f} ms not the linears; "
              f"bound with linears at their bytes' limit: {bounds}")  # fmt: skip
    print("compiled generates the eager tokens:", torch.equal(eager_ids, compiled_ids))


if __name__ == "__main__":
    main()
