"""SparseGPT's column loop in float32 (the default for float32 weights) against float64
(``float64_updates=True``, this library before issue 48), on GPT-2-sized layers: CPU seconds per
call, and whether the masks agree.

    python benchmarks/sparsegpt_update_dtype.py [--repeats 8]
"""

from __future__ import annotations

import argparse
import time

import torch

from convergent.sparse import hessian, sparsegpt_prune

# [out, in] of the benchmark GPT-2's layers (c_attn, c_fc, the MLP's c_proj) and 128 windows
# of 48 tokens, as llmcompressor_compare.py calibrates them.
SHAPES = ((384, 128), (512, 128), (128, 512))
TOKENS = 128 * 48


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--sparsity", type=float, default=0.7)
    arguments = parser.parse_args()
    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(0)
    print("| layer [out, in] | float32 loop, CPU s | float64 loop, CPU s | float64 / float32 |"
          " masks equal |\n|---|---|---|---|---|")  # fmt: skip
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
        h = hessian(torch.randn(TOKENS, in_features, generator=generator))
        seconds = {False: 0.0, True: 0.0}
        masks = {}
        for float64_updates in (False, True):  # untimed: the first call of each warms up
            sparsegpt_prune(weight, h, arguments.sparsity, float64_updates=float64_updates)
        for _ in range(arguments.repeats):
            for float64_updates in (False, True):  # alternated, so that load hits both alike
                start = time.process_time()
                _, masks[float64_updates] = sparsegpt_prune(
                    weight, h, arguments.sparsity, float64_updates=float64_updates
                )
                seconds[float64_updates] += time.process_time() - start
        fast, slow = (seconds[k] / arguments.repeats for k in (False, True))
        equal = bool(torch.equal(masks[False], masks[True]))
        print(f"| [{out_features}, {in_features}] | {fast:.3f} | {slow:.3f} | {slow / fast:.1f}x |"
              f" {'yes' if equal else 'no'} |")  # fmt: skip


if __name__ == "__main__":
    main()
