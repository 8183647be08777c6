"""Time per optimizer step: HORST and HAM against torch.optim.AdamW and a bandwidth reference.

For each size (25 M and 100 M float32 parameters, as 1024 x 1024 matrices plus one bias
vector per matrix) it times one `step()` of

- torch.optim.AdamW: default (single tensor on CPU), foreach=True, fused=True;
- HORST: reference, foreach and compiled implementations (alpha = 1, beta = 1e-3);
- HAM around AdamW(fused=True);
- the gradient finiteness check HORST runs before each step (already inside its times), and
  HORST compiled with nonfinite="ignore" (no check, as torch.optim);
- one read of every gradient element (a sum over one flat buffer): the floor of any check
  that must see every gradient before the step changes anything, so HORST with its guard
  cannot beat (bandwidth reference + this) / AdamW(fused);
- a bandwidth reference: the time to stream 7 float32 tensors per element (read theta,
  grad, m, v; write theta, m, v), measured as in-place elementwise ops on flat buffers.

Configurations run interleaved, several rounds; the table shows the fastest round (the
machine is shared) as ratios to AdamW(fused=True) and to the bandwidth reference, with the
peak memory a step allocates beyond what it held before (Linux VmHWM, reset per step).
Targets (`TARGETS`, each printed with whether it is met): HORST compiled <= 1.15x AdamW(fused),
guard included, and <= 1.4x the bandwidth reference; HAM around AdamW(fused) <= 1.15x; the
finiteness guard alone <= 0.15x (one read of the gradients). `--figure` draws each
configuration's time per step against the size, so that super-linear growth would show.

Run: python benchmarks/optimizer_step.py [--sizes 25 100] [--rounds 5] [--only compiled HAM]
     [--figure scaling.png]
On a shared machine, OMP_WAIT_POLICY=PASSIVE keeps OpenMP threads from spinning against
other processes, and `--only` with many rounds gives the fast configurations more chances.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import torch

from convergent.optim import HAM, HORST, first_nonfinite

COLUMNS = 1024
# (configuration, reference, largest ratio allowed)
TARGETS = (
    ("HORST (compiled)", "AdamW (fused)", 1.15),
    ("HORST (compiled)", "bandwidth reference (7 streams)", 1.4),
    ("HAM (AdamW fused)", "AdamW (fused)", 1.15),
    ("finiteness check alone", "AdamW (fused)", 0.15),
)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _peak_extra_bytes(run: Callable[[], object]) -> int | None:
    """Peak resident memory during `run` above the resident memory before it, or None."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM to the current resident size
    except OSError:
        return None
    before = _status_kib("VmRSS")
    run()
    return (_status_kib("VmHWM") - before) * 1024


def _make_parameters(millions: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    params = []
    for _ in range(millions):
        params.append(torch.randn(COLUMNS, COLUMNS, generator=generator).requires_grad_())
        params.append(torch.randn(COLUMNS, generator=generator).requires_grad_())
    for param in params:
        param.grad = torch.randn(param.shape, generator=generator) * 1e-3
    return params


def _configurations(
    params: list[torch.Tensor], only: list[str] | None = None
) -> dict[str, Callable[[], object]]:
    def wanted(name: str) -> bool:
        return only is None or any(word.lower() in name.lower() for word in only)

    def optimizer_step(
        name: str, make: Callable[[], torch.optim.Optimizer]
    ) -> Callable[[], object]:
        if not wanted(name) and name != "AdamW (fused)":
            return lambda: None
        optimizer = make()
        optimizer.step()  # allocates the state (and compiles) outside the timing
        return optimizer.step

    horst = {"lr": 1e-4, "alpha": 1.0, "beta": 1e-3}
    grads = [param.grad for param in params]
    count = sum(param.numel() for param in params)
    # Four flat buffers, touched now so that their pages are not counted as a peak.
    theta, grad, exp_avg, exp_avg_sq = (torch.ones(count) for _ in range(4))

    def bandwidth() -> None:
        # The optimizer's traffic, in place: read theta, grad, m, v; write theta, m, v. In-place
        # updates, like the optimizers' (a copy into another buffer would also pay the
        # read-for-ownership of its destination and make the reference look slow).
        theta.add_(grad)
        exp_avg.mul_(1.0)
        exp_avg_sq.mul_(1.0)

    makers: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "AdamW (default)": lambda: torch.optim.AdamW(params, lr=1e-4),
        "AdamW (foreach)": lambda: torch.optim.AdamW(params, lr=1e-4, foreach=True),
        "AdamW (fused)": lambda: torch.optim.AdamW(params, lr=1e-4, fused=True),
        "HORST (reference)": lambda: HORST(params, implementation="reference", **horst),
        "HORST (foreach)": lambda: HORST(params, implementation="foreach", **horst),
        "HORST (compiled)": lambda: HORST(params, implementation="compiled", **horst),
        "HORST (compiled, no guard)": lambda: HORST(
            params, implementation="compiled", nonfinite="ignore", **horst
        ),
        "HAM (AdamW fused)": lambda: HAM(torch.optim.AdamW(params, lr=1e-4, fused=True)),
    }
    configurations: dict[str, Callable[[], object]] = {"bandwidth reference (7 streams)": bandwidth}
    configurations.update({name: optimizer_step(name, make) for name, make in makers.items()})
    configurations["finiteness check alone"] = lambda: first_nonfinite(grads)
    # The guard's floor: one read of every gradient element (a sum over one flat buffer).
    configurations["one read of the gradients (flat)"] = lambda: grad.sum().item()
    # The two references are always measured; the rest as --only asks.
    return {
        name: run
        for name, run in configurations.items()
        if wanted(name) or name in ("bandwidth reference (7 streams)", "AdamW (fused)")
    }


def benchmark(millions: int, rounds: int, only: list[str] | None = None) -> dict[str, float]:
    """Print the table for ``millions`` M parameters; return each configuration's best time."""
    params = _make_parameters(millions)
    count = sum(param.numel() for param in params)
    configurations = _configurations(params, only)
    times: dict[str, list[float]] = {name: [] for name in configurations}
    extra: dict[str, int | None] = {}
    for round_index in range(rounds):
        for name, run in configurations.items():
            gc.collect()
            if round_index == 0:
                extra[name] = _peak_extra_bytes(run)
                continue
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    best = {name: min(values) for name, values in times.items()}
    fused, stream = best["AdamW (fused)"], best["bandwidth reference (7 streams)"]
    param_bytes = 4 * count
    print(f"\n{count / 1e6:.1f} M float32 parameters ({len(params)} tensors), "
          f"{torch.get_num_threads()} threads, best of {rounds - 1} rounds")  # fmt: skip
    print(
        f"{'':34s}{'ms/step':>10s}{'/ AdamW fused':>15s}{'/ bandwidth':>13s}{'peak extra / params':>21s}"
    )
    for name, seconds in best.items():
        peak = extra[name]
        peak_text = "n/a" if peak is None else f"{peak / param_bytes:.2f}x"
        print(
            f"{name:34s}{1e3 * seconds:10.1f}{seconds / fused:15.2f}{seconds / stream:13.2f}{peak_text:>21s}"
        )
    for name, reference, limit in TARGETS:
        if name in best and reference in best:
            ratio = best[name] / best[reference]
            verdict = "met" if ratio <= limit else "NOT met"
            print(f"target: {name} / {reference} = {ratio:.2f}x (<= {limit}x: {verdict})")
    del configurations, params
    gc.collect()
    return {name: seconds / count for name, seconds in best.items()}


def scaling_figure(per_parameter: dict[int, dict[str, float]], path: str) -> None:
    """Nanoseconds per parameter and step against the size: flat lines scale linearly."""
    import matplotlib
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 4.5))
    axis = figure.subplots()
    sizes = sorted(per_parameter)
    # eleven lines: tab20 keeps each its own colour (the default cycle repeats after ten)
    colours = iter(matplotlib.colormaps["tab20"].colors)
    for name in per_parameter[sizes[0]]:
        values = [1e9 * per_parameter[size][name] for size in sizes if name in per_parameter[size]]
        if len(values) == len(sizes):
            axis.plot(sizes, values, marker="o", label=name, color=next(colours))
    # log y: the fast paths (about 1 ns a parameter) stay apart from the slow ones (10 ns)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("millions of float32 parameters")
    axis.set_ylabel("ns per parameter per step (best round)")
    axis.set_title(f"optimizer step time per parameter, {torch.get_num_threads()} threads")
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"scaling figure: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[25, 100], help="millions of parameters"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the first measures memory)")
    parser.add_argument(
        "--only", nargs="+", help="time only configurations whose name contains a word"
    )
    parser.add_argument("--figure", help="write the scaling figure (PNG) here")
    arguments = parser.parse_args()
    per_parameter = {
        millions: benchmark(millions, arguments.rounds, arguments.only)
        for millions in arguments.sizes
    }
    if arguments.figure:
        scaling_figure(per_parameter, arguments.figure)


if __name__ == "__main__":
    main()
