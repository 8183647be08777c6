"""Global magnitude masks for ~100 M parameters: convergent.sparse vs torch.nn.utils.prune.

Both build the masks that prune the smallest-magnitude half of the same weights
(``global_unstructured`` with ``L1Unstructured``); the masks are checked identical and the
times printed as ratios against ``prune`` measured in the same run. Also shown: our
reference path (concatenate the magnitudes, ``kthvalue``), to show where the time goes.

    python benchmarks/pruning.py [--parameters 100e6] [--sparsity 0.5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn.utils import prune

from convergent.sparse import global_magnitude_masks, keep_largest, magnitude_threshold_reference
from convergent.sparse.topk import count_to_prune


def build_layers(parameters: float, seed: int = 0) -> list[nn.Linear]:
    """Transformer-like weight matrices (d=1024: 4 square, 2 of 4x) until ``parameters``.

    The magnitudes are all distinct (a random permutation of float32 bit patterns, with
    random signs). With 1e8 Gaussian float32 weights, several share the threshold's value
    (about 4 per unit in the last place near the median), and prune and we may then break
    the tie differently: distinct magnitudes make "identical masks" a well-posed check.
    """
    generator = torch.Generator().manual_seed(seed)
    d = 1024
    shapes = [(d, d)] * 4 + [(4 * d, d), (d, 4 * d)]
    layers: list[nn.Linear] = []
    total = 0
    while total < parameters:
        for out_features, in_features in shapes:
            layers.append(nn.Linear(in_features, out_features, bias=False))
            total += out_features * in_features
    bits = torch.randperm(total, generator=generator, dtype=torch.int32).add_(0x3C000000)
    values = bits.view(torch.float32)
    values.mul_(torch.randint(0, 2, (total,), generator=generator).mul_(2).sub_(1))
    start = 0
    with torch.no_grad():
        for layer in layers:
            size = layer.weight.numel()
            layer.weight.copy_(values[start : start + size].view_as(layer.weight))
            start += size
    return layers


def timed(function, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parameters", type=float, default=100e6)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    layers = build_layers(arguments.parameters)
    weights = {f"{i}.weight": layer.weight for i, layer in enumerate(layers)}
    total = sum(w.numel() for w in weights.values())
    print(f"{total / 1e6:.1f} M parameters in {len(weights)} tensors, sparsity "
          f"{arguments.sparsity}, torch {torch.__version__}, {torch.get_num_threads()} threads")  # fmt: skip

    ours_time, ours = timed(lambda: global_magnitude_masks(weights, arguments.sparsity),
                            arguments.repeats)  # fmt: skip
    k = count_to_prune(arguments.sparsity, total)
    values = list(weights.values())
    reference_time, _ = timed(
        lambda: keep_largest(values, k, magnitude_threshold_reference(values, k)), 1
    )

    def with_prune():
        prune.global_unstructured([(layer, "weight") for layer in layers],
                                  pruning_method=prune.L1Unstructured, amount=arguments.sparsity)  # fmt: skip
        masks = {f"{i}.weight": layer.weight_mask.bool() for i, layer in enumerate(layers)}
        for layer in layers:
            prune.remove(layer, "weight")  # restores a plain parameter (now pruned)
        return masks

    # prune zeroes the weights it prunes; run it on copies so that ours saw the same weights.
    with torch.no_grad():
        originals = [layer.weight.detach().clone() for layer in layers]
    prune_time, theirs = timed(with_prune, 1)
    with torch.no_grad():
        for layer, original in zip(layers, originals, strict=True):
            layer.weight.copy_(original)

    identical = all(torch.equal(ours[name], theirs[name]) for name in weights)  # type: ignore[index]
    print(f"{'method':<44} {'seconds':>8} {'vs prune':>9}")
    for label, seconds in (
        ("torch.nn.utils.prune.global_unstructured", prune_time),
        ("convergent reference (cat + kthvalue)", reference_time),
        ("convergent global_magnitude_masks", ours_time),
    ):
        print(f"{label:<44} {seconds:8.3f} {prune_time / seconds:8.1f}x")
    print(f"masks identical: {identical}; target >= 5x: "
          f"{'met' if prune_time / ours_time >= 5 and identical else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
