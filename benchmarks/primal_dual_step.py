"""Time of a primal-dual step against an ERM step: same model, batch and optimizer.

A step is forward + backward + AdamW step + the training step's after-step work (the dual
update for primal-dual). Prints the median time of each and their ratio for our small
Transformer (classification), MiniLM-L6 (classification, skipped if it is not cached) and a
small Transformer with a large-vocabulary language-model head: every layer read out exactly
(no target: L + 1 vocabulary projections), every layer from a share of the target tokens
(``token_fraction``, the last layer exact), and one sampled layer from that share. Targets:
at most 1.15x (classification), 1.5x (LM head, every layer, token share) and 1.3x (LM head,
one sampled layer, token share).

    python benchmarks/primal_dual_step.py [--repeats 20] [--threads 2] [--no-minilm]
        [--token-fraction 0.0625]

Steps of the two kinds are interleaved, and the clock is this process's CPU time by
default (``--clock wall`` for wall time), so other work on a shared machine distorts the
ratio little.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from convergent.models import Transformer, TransformerConfig
from convergent.train import ErmStep
from convergent.train.primal_dual import descent_step

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
CLOCK = CLOCKS["cpu"]


def _timer(
    model: torch.nn.Module, step: Any, batch: dict[str, torch.Tensor]
) -> Callable[[], float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def once() -> float:
        start = CLOCK()
        optimizer.zero_grad(set_to_none=True)
        loss, _ = step.loss(model, batch)
        loss.backward()
        optimizer.step()
        step.after_optimizer_step(model)
        return CLOCK() - start

    return once


def compare(
    name: str,
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    task: str,
    repeats: int,
    target: float | None,
    **descent: Any,
) -> float:
    """Print and return median(primal-dual) / median(ERM)."""
    model.train()
    erm = _timer(model, ErmStep(task), batch)
    primal_dual = _timer(
        model, descent_step(task, model.num_layers, alpha=0.05, dual_lr=0.1, **descent), batch
    )
    for _ in range(2):  # warm-up
        erm(), primal_dual()
    erm_times, pd_times = [], []
    for _ in range(repeats):
        erm_times.append(erm())
        pd_times.append(primal_dual())
    ratio = statistics.median(pd_times) / statistics.median(erm_times)
    if target is None:
        verdict = "no target"
    else:
        verdict = f"target <= {target}x: {'met' if ratio <= target else 'NOT met'}"
    print(
        f"{name:<52} ERM {1e3 * statistics.median(erm_times):8.1f} ms   primal-dual "
        f"{1e3 * statistics.median(pd_times):8.1f} ms   ratio {ratio:5.2f}x ({verdict})"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-minilm", action="store_true")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument(
        "--token-fraction", type=float, default=1 / 16, help="share of target tokens read out"
    )
    args = parser.parse_args()
    global CLOCK
    CLOCK = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    config = TransformerConfig(
        vocab_size=1000,
        num_outputs=2,
        d_model=128,
        n_heads=4,
        n_layers=4,
        max_len=64,
        pooling="mean",
    )
    ids = torch.randint(0, 1000, (32, 64))
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": torch.randint(0, 2, (32,)),
    }
    compare(
        "small Transformer, classification",
        Transformer(config),
        batch,
        "classification",
        args.repeats,
        1.15,
    )

    if not args.no_minilm:
        from convergent.data import is_cached, minilm_path
        from convergent.models import HFEncoder

        if is_cached("minilm-l6"):
            model = HFEncoder.from_pretrained(
                minilm_path(), num_outputs=2, pooling="mean", attn_implementation="sdpa"
            )
            ids = torch.randint(1000, 20000, (32, 48))
            batch = {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "labels": torch.randint(0, 2, (32,)),
            }
            compare("MiniLM-L6, classification", model, batch, "classification", args.repeats, 1.15)
        else:
            print("MiniLM-L6 is not cached; skipped (convergent data fetch minilm-l6)")

    vocab = 16384
    config = TransformerConfig(
        task="lm", vocab_size=vocab, d_model=128, n_heads=4, n_layers=6, max_len=64, causal=True
    )
    model = Transformer(config)
    ids = torch.randint(0, vocab, (16, 65))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    compare(f"LM head ({vocab} vocab), every layer, exact", model, batch, "lm", args.repeats, None)
    share = args.token_fraction
    compare(
        f"LM head ({vocab} vocab), every layer, {share:.4g} of tokens",
        model,
        batch,
        "lm",
        args.repeats,
        1.5,
        token_fraction=share,
    )
    compare(
        f"LM head ({vocab} vocab), 1 sampled layer, {share:.4g} of tokens",
        model,
        batch,
        "lm",
        args.repeats,
        1.3,
        layers_per_step=1,
        token_fraction=share,
    )


if __name__ == "__main__":
    main()
