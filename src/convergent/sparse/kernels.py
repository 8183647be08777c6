"""Sparse kernels where they are faster: pruned layers multiplied through PyTorch's sparse formats.

    model.eval()
    report = to_sparse_kernels(model, tokens=16)     # times each pruned layer at [16, in]
    print("\\n".join(report.notes()))                  # which layers stayed dense, and why

A pruned ``nn.Linear`` (or GPT-2's ``Conv1D``) computes y = x W^T + b. On the CPU the
sparse path keeps W as CSR with int32 indices (or BSR, in blocks, where its blocks are
mostly full) and computes y^T = W x^T through ``torch.addmm``, or runs the decode kernel of
:mod:`convergent.sparse.decode_kernels` (kept values and uint16 columns, compiled by numba;
float32 and bfloat16, made for few tokens per forward); on CUDA a 2:4 pattern runs
through ``torch.sparse.to_sparse_semi_structured``. PyTorch's kernels beat the dense GEMM only
at high sparsity and depending on the shape (a 2048 x 2048 layer at 90 % was 1.4-3.5x faster
on one core, at 50 % 1.2-3.7x slower), so each candidate layer is timed, dense against each
sparse format, on this machine with a ``[tokens, in]`` input, and switches only where the
sparse kernel is faster. Every layer left dense gets one line saying why; a format this
device or dtype lacks is said once for all layers.

Inference only: a converted layer has no trainable weight (training through sparse kernels is
out of scope), and a model in training mode is refused. Outputs equal the dense layer's up to
float rounding (the sums run in another order): within ``OUTPUT_TOLERANCE`` of
``|x| |W|^T`` elementwise, tested.
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from convergent.sparse.decode_kernels import (
    DECODE_DTYPES,
    IndexedLinear,
    decode_bytes_gain,
    decode_kernel_reason,
)
from convergent.sparse.decode_kernels import LAYOUT as DECODE_LAYOUT
from convergent.sparse.selection import is_conv1d
from convergent.sparse.streamed_timing import Rotation, copies_to_stream

logger = logging.getLogger(__name__)

# Below this share of zeros no PyTorch sparse kernel was ever faster here: not even timed.
MIN_SPARSITY = 0.5
# A layer switches only where its kernel beats dense by this much on its own: per-layer gains of
# 1.0-1.2x at 50 % (ELL's ceiling there is about 1.2x) came to 0.72-0.91x of dense for the
# whole model under generate (each call's ~20 us overhead, timing noise), so a smaller gain is
# no gain a user keeps (docs/design.md, "Loading and decoding a pruned model").
MIN_SPEEDUP = 1.25
# Where the decode kernel reads less than 1.5x fewer bytes than dense (float32 below about 56 %
# sparse, bfloat16 below 67 %), a layer switches to it only if it gains 1.5x: on a Zen 3 CPU
# (AVX2) at 50 % (a 1.33x bytes limit), layers that timed 1.25x and more on their own still left
# generate at 0.91x of dense; on a Zen 5 (AVX-512), whose dense GEMV runs far below the memory's
# speed, the same ELL layers ran 1.9x dense (docs/design.md). Where it reads no fewer bytes it
# is not tried.
MIN_BYTES_GAIN = 1.5
FEW_BYTES_SPEEDUP = 1.5
# BSR is tried only where its blocks store at most this many entries per nonzero.
BSR_BLOCKS = (16, 8, 4)
BSR_MAX_FILL = 1.5
# Relative error bound of the sparse outputs, per element, against |x| |W|^T (float32).
OUTPUT_TOLERANCE = 1e-5
CSR_DTYPES = (torch.float32, torch.float64)
SEMI_STRUCTURED_DTYPES = (torch.float16, torch.bfloat16)
TIMING_REPEATS = 15
TIMING_SECONDS = 1e-3  # each timed sample runs the call this long at least

# Why a layer stayed dense, by key (a report counts layers by these, never by wording).
TOO_DENSE, SLOWER, NO_KERNEL, FAILED = "too dense", "slower", "no kernel", "failed"
CAUSES = {
    TOO_DENSE: "too dense to try (below the least sparsity)",
    SLOWER: "slower on every sparse kernel than dense (too narrow, or too few zeros, to gain)",
    NO_KERNEL: "no sparse kernel for its dtype or device",
    FAILED: "no sparse kernel ran",
}

# calls -> per call, the seconds of each sample (samples taken in turn, call by call).
Timer = Callable[[Sequence[Callable[[], Any]]], list[list[float]]]


class SparseLinear(nn.Module):
    """y = x W^T + b with W held in a sparse layout: CSR or BSR (int32 indices), or 2:4
    semi-structured on CUDA. Inference only: W is a buffer, not a parameter.

    Args:
        weight: the dense ``[out, in]`` weight (already pruned).
        bias: ``[out]`` or None.
        layout: ``"csr"``, ``"bsr"`` (with ``blocksize``) or ``"2:4"``.
        blocksize: the BSR block edge.
    """

    sparse_weight: Tensor
    bias: Tensor | None

    def __init__(
        self, weight: Tensor, bias: Tensor | None, layout: str, blocksize: int | None = None
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(size) for size in weight.shape)
        self.layout = layout if blocksize is None else f"{layout} {blocksize}x{blocksize}"
        self.sparsity = float((weight == 0).float().mean())
        dense = weight.detach()
        with warnings.catch_warnings():  # "sparse CSR support is in beta": said once, here
            warnings.simplefilter("ignore", UserWarning)
            sparse = self._sparse(dense, layout, blocksize)
        self.register_buffer("sparse_weight", sparse, persistent=False)
        self.register_buffer(
            "bias", None if bias is None else bias.detach().clone(), persistent=False
        )

    @staticmethod
    def _sparse(dense: Tensor, layout: str, blocksize: int | None) -> Tensor:
        if layout == "2:4":
            return torch.sparse.to_sparse_semi_structured(dense)
        if layout == "csr":
            stored, build = dense.to_sparse_csr(), torch.sparse_csr_tensor
        elif layout == "bsr" and blocksize is not None:
            stored, build = dense.to_sparse_bsr((blocksize, blocksize)), torch.sparse_bsr_tensor
        else:
            raise ValueError(
                f"layout must be 'csr', 'bsr' (with a blocksize) or '2:4', got {layout!r}"
            )
        # int32 indices: MKL's kernels take them, and they halve the indices' memory traffic.
        return build(
            stored.crow_indices().to(torch.int32),
            stored.col_indices().to(torch.int32),
            stored.values(),
            stored.shape,
        )

    def forward(self, x: Tensor) -> Tensor:
        """``x`` ``[..., in]`` -> ``[..., out]``."""
        if self.layout == "2:4":
            return F.linear(x, self.sparse_weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        if self.bias is None:
            transposed = self.sparse_weight @ rows.T
        else:
            transposed = torch.addmm(self.bias.unsqueeze(1), self.sparse_weight, rows.T)
        return transposed.T.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"layout={self.layout}, sparsity={self.sparsity:.3f}"
        )


def linear_weight(module: nn.Module) -> Tensor:
    """The ``[out, in]`` weight of an ``nn.Linear`` or a ``Conv1D`` (stored ``[in, out]``)."""
    weight = module.get_parameter("weight").detach()
    return weight.T if is_conv1d(module) else weight


@dataclass
class LayerChoice:
    """What :func:`to_sparse_kernels` decided for one layer.

    Attributes:
        name: the module's name.
        shape: ``[out, in]``.
        sparsity: the share of its weights that are zero.
        kernel: ``"dense"`` or the sparse layout it now runs (``"csr"``, ``"bsr 8x8"``, ``"2:4"``).
        dense_seconds: one forward of the dense layer at the timed shape, the fastest sample
            (None: not timed).
        sparse_seconds: the fastest sparse layout's (None: none timed).
        speedup: that layout's :func:`fastest_speedup` over dense (above 1: faster).
        reason: for a layer left dense, why (a sentence).
        cause: for a layer left dense, the key of why: one of ``CAUSES``.
    """

    name: str
    shape: list[int]
    sparsity: float
    kernel: str
    dense_seconds: float | None = None
    sparse_seconds: float | None = None
    speedup: float | None = None
    reason: str = ""
    cause: str = ""


@dataclass
class KernelReport:
    """Every candidate layer's choice, and the formats the device lacked (said once each)."""

    tokens: int
    device: str
    layers: list[LayerChoice] = field(default_factory=list)
    unavailable: dict[str, int] = field(default_factory=dict)

    @property
    def converted(self) -> list[LayerChoice]:
        """The layers that now run a sparse kernel."""
        return [layer for layer in self.layers if layer.kernel != "dense"]

    def notes(self) -> list[str]:
        """One line per layer and per missing format, as logged."""
        lines = [f"{reason} ({count} layer(s))" for reason, count in self.unavailable.items()]
        for layer in self.layers:
            if layer.kernel == "dense":
                lines.append(f"{layer.name}: {layer.reason}")
            else:
                lines.append(
                    f"{layer.name}: {layer.kernel}, {layer.speedup:.2f}x as fast as dense at "
                    f"{layer.sparsity:.0%} sparse ({self.tokens} tokens)"
                )
        return lines

    def as_dict(self) -> dict[str, Any]:
        """Ready for JSON."""
        return {
            "tokens": self.tokens,
            "device": self.device,
            "unavailable": dict(self.unavailable),
            "layers": [dict(vars(layer)) for layer in self.layers],
        }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_samples(
    calls: Sequence[Callable[[], Any]],
    device: torch.device | None = None,
    repeats: int = TIMING_REPEATS,
) -> list[list[float]]:
    """Seconds per call of each of ``calls``: ``repeats`` samples each, taken in turn (ABAB...)
    so that a change in the machine's load falls on all of them alike. Each sample repeats
    its call until it has run ``TIMING_SECONDS``, after three warm-up calls."""
    device = device or torch.device("cpu")
    loops = []
    for call in calls:
        for _ in range(3):
            call()
        _synchronize(device)
        start = time.perf_counter()
        call()
        _synchronize(device)
        once = max(time.perf_counter() - start, 1e-7)
        loops.append(max(1, int(TIMING_SECONDS / once)))
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for index, call in enumerate(calls):
            start = time.perf_counter()
            for _ in range(loops[index]):
                call()
            _synchronize(device)
            samples[index].append((time.perf_counter() - start) / loops[index])
    return samples


def fastest_speedup(dense: Sequence[float], sparse: Sequence[float]) -> float:
    """The fastest dense sample over the fastest sparse one: above 1 the sparse call is
    faster. Other processes only ever add time to a sample, so on a shared machine the
    fastest of several interleaved samples is the steadiest estimate of each call's cost."""
    return min(dense) / min(sparse)


def _is_two_four(weight: Tensor) -> bool:
    if weight.shape[1] % 4:
        return False
    return bool(((weight.reshape(-1, 4) != 0).sum(dim=1) <= 2).all())


def _bsr_blocks(weight: Tensor) -> list[int]:
    """Block edges whose BSR layout stores at most ``BSR_MAX_FILL`` entries per nonzero."""
    nonzero = max(int((weight != 0).sum()), 1)
    blocks = []
    out_features, in_features = weight.shape
    for edge in BSR_BLOCKS:
        if out_features % edge or in_features % edge:
            continue
        occupied = (weight != 0).reshape(out_features // edge, edge, -1, edge).any(dim=(1, 3))
        if int(occupied.sum()) * edge * edge <= BSR_MAX_FILL * nonzero:
            blocks.append(edge)
    return blocks


def _layouts(weight: Tensor) -> tuple[list[tuple[str, int | None]], list[str]]:
    """The sparse layouts to time for ``weight`` on its device, and why others are missing."""
    device, dtype = weight.device, weight.dtype
    missing: list[str] = []
    layouts: list[tuple[str, int | None]] = []
    if device.type == "cuda":
        if not _is_two_four(weight):
            missing.append("dense: only 2:4 patterns have a sparse kernel on CUDA here")
        elif dtype not in SEMI_STRUCTURED_DTYPES:
            missing.append(
                f"dense: CUDA's 2:4 semi-structured kernel takes float16 or bfloat16, not "
                f"{str(dtype).removeprefix('torch.')}"
            )
        else:
            layouts.append(("2:4", None))
        return layouts, missing
    if device.type != "cpu":
        return [], [f"dense: no sparse kernel is known for device {device.type}"]
    decode = decode_kernel_reason(weight)
    if decode is None and decode_bytes_gain(weight) <= 1.0:
        decode = (
            "dense: at this sparsity the decode kernel reads no fewer bytes than dense (values"
            " plus 2-byte columns)"
        )
        missing.append(decode)
    elif decode is None:
        layouts.append((DECODE_LAYOUT, None))
    elif dtype in DECODE_DTYPES:  # numba missing or broken: said once, for every layer
        missing.append(decode)
    if dtype in CSR_DTYPES:
        layouts.append(("csr", None))
        layouts += [("bsr", edge) for edge in _bsr_blocks(weight)]
    elif not layouts and not missing:
        missing.append(
            f"dense: this CPU has no sparse kernel for {str(dtype).removeprefix('torch.')} "
            "(CSR and BSR take float32 and float64, the decode kernel float32 and bfloat16)"
        )
    return layouts, missing


def build_sparse(
    weight: Tensor, bias: Tensor | None, layout: str, blocksize: int | None = None
) -> nn.Module:
    """The sparse module of ``layout``: the decode kernel (:class:`IndexedLinear`) or a
    :class:`SparseLinear` (CSR, BSR with ``blocksize``, 2:4)."""
    if layout == DECODE_LAYOUT:
        return IndexedLinear(weight, bias)
    return SparseLinear(weight, bias, layout, blocksize)


def _bias(module: nn.Module) -> Tensor | None:
    bias = getattr(module, "bias", None)
    return bias if isinstance(bias, Tensor) else None


def _shared_weights(model: nn.Module) -> set[int]:
    """ids of parameters that more than one module holds (tied embeddings)."""
    counts: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            counts[id(parameter)] = counts.get(id(parameter), 0) + 1
    return {key for key, count in counts.items() if count > 1}


def _bytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


@torch.no_grad()
def to_sparse_kernels(
    model: nn.Module,
    *,
    tokens: int = 16,
    min_sparsity: float = MIN_SPARSITY,
    timer: Timer | None = None,
) -> KernelReport:
    """Replace each pruned linear layer by a :class:`SparseLinear` where that is faster, in place.

    A layer is a candidate when it is an ``nn.Linear`` or a ``Conv1D`` whose weight is not
    shared with another module and at least ``min_sparsity`` of its weights are zero. Each
    candidate's dense forward and each sparse layout this device offers for it are timed on
    a random ``[tokens, in]`` input in the layer's dtype and device (median of interleaved
    samples); the fastest sparse layout replaces the layer only when it beats dense.

    Under ``torch.compile`` the decode kernel is one operator in the graph, but a CSR or BSR
    layer is not traceable (dynamo does not wrap sparse tensors): a model to be compiled
    should keep only decode-kernel layers (docs/design.md, "Decoding under torch.compile").

    Args:
        model: the model, in eval mode (training through sparse kernels is out of scope).
        tokens: rows per forward, batch x sequence length, as the model will be run.
        min_sparsity: the least share of zeros at which a layer is timed, in [0, 1].
        timer: ``calls -> per call, its samples' seconds`` (default :func:`timed_samples`),
            for tests.

    Returns:
        A :class:`KernelReport`; its notes are also logged (INFO; missing formats WARNING).

    Raises:
        ValueError: a model in training mode, or ``tokens`` or ``min_sparsity`` out of range.
    """
    if model.training:
        raise ValueError(
            "to_sparse_kernels needs a model in eval mode (call model.eval() first): sparse "
            "kernels compute forward passes only; training through them is out of scope"
        )
    if tokens < 1:
        raise ValueError(f"tokens={tokens} is out of range; it must be >= 1")
    if not 0.0 <= min_sparsity <= 1.0:
        raise ValueError(f"min_sparsity={min_sparsity} is out of range; it must be in [0, 1]")
    shared = _shared_weights(model)
    candidates = [
        (name, module)
        for name, module in model.named_modules()
        if (isinstance(module, nn.Linear) or is_conv1d(module)) and id(module.weight) not in shared
    ]
    report = KernelReport(
        tokens, str(next(iter(model.parameters())).device) if candidates else "cpu"
    )
    model_bytes = sum(_bytes(linear_weight(module)) for _, module in candidates)
    for name, module in candidates:
        weight = linear_weight(module)
        sparsity = float((weight == 0).float().mean())
        if sparsity == 0.0:
            continue  # a dense layer: nothing to decide, nothing to say
        choice = LayerChoice(name, list(weight.shape), sparsity, "dense")
        report.layers.append(choice)
        if sparsity < min_sparsity:
            choice.cause = TOO_DENSE
            choice.reason = (
                f"dense: {sparsity:.0%} sparse, below the {min_sparsity:.0%} at which a sparse "
                "kernel is tried"
            )
            continue
        layouts, missing = _layouts(weight)
        for reason in missing:
            report.unavailable[reason] = report.unavailable.get(reason, 0) + 1
        if not layouts:
            choice.cause = NO_KERNEL
            choice.reason = missing[0] if missing else "dense: no sparse kernel for this layer"
            continue
        copies = copies_to_stream(_bytes(weight), model_bytes) if weight.is_cpu else 1
        chosen = _choose(choice, module, weight, layouts, tokens, timer, copies)
        if chosen is not None:
            _replace(model, name, chosen)
    for reason, count in report.unavailable.items():
        logger.warning("%s (%d layer(s))", reason, count)
    for line in report.notes()[len(report.unavailable) :]:
        logger.info("%s", line)
    return report


def _choose(
    choice: LayerChoice,
    module: nn.Module,
    weight: Tensor,
    layouts: list[tuple[str, int | None]],
    tokens: int,
    timer: Timer | None,
    copies: int = 1,
) -> nn.Module | None:
    """Time the dense layer against each layout and record the winner in ``choice``; the
    winning sparse module, or None where dense is fastest. With ``copies`` > 1 each is timed
    over that many copies called in turn, its weights streamed from memory
    (:mod:`convergent.sparse.streamed_timing`)."""
    inputs = torch.randn(tokens, weight.shape[1], dtype=weight.dtype, device=weight.device)
    built: list[tuple[str, list[nn.Module]]] = []
    failures = []
    for layout, blocksize in layouts:
        try:
            sparse = [build_sparse(weight, _bias(module), layout, blocksize)]
            sparse[0](inputs)
            sparse += [copy.deepcopy(sparse[0]) for _ in range(copies - 1)]
        except (RuntimeError, ValueError, NotImplementedError) as error:
            failures.append(f"{layout}: {str(error).splitlines()[0] if str(error) else error}")
            continue
        built.append((str(sparse[0].layout), sparse))
    if not built:
        choice.cause = FAILED
        choice.reason = f"dense: no sparse kernel ran here ({'; '.join(failures)})"
        return None
    dense = [module] + [copy.deepcopy(module) for _ in range(copies - 1)]
    calls: list[Callable[[], Any]] = [Rotation(dense, inputs, "dense")]
    calls += [Rotation(sparse, inputs, layout) for layout, sparse in built]
    samples = timer(calls) if timer is not None else timed_samples(calls, weight.device)
    speedups = [fastest_speedup(samples[0], sample) for sample in samples[1:]]
    required = [_required_speedup(layout, weight) for layout, _ in built]
    passing = [index for index in range(len(built)) if speedups[index] >= required[index]]
    best = max(passing or range(len(built)), key=lambda index: speedups[index])
    choice.dense_seconds, choice.sparse_seconds = min(samples[0]), min(samples[best + 1])
    choice.speedup = speedups[best]
    if passing:
        choice.kernel = built[best][0]
        return built[best][1][0]
    choice.cause = SLOWER
    choice.reason = (
        f"dense: the sparse kernel took {1 / choice.speedup:.1f}x as long at {choice.sparsity:.0%}"
        if choice.speedup <= 1.0
        else f"dense: the sparse kernel gained only {choice.speedup:.2f}x at "
        f"{choice.sparsity:.0%}, under the {required[best]:g}x a layer must gain to switch"
        + (
            f" where the decode kernel reads less than {MIN_BYTES_GAIN:g}x fewer bytes"
            if required[best] > MIN_SPEEDUP
            else ""
        )
    )
    return None


def _required_speedup(layout: str, weight: Tensor) -> float:
    """The timed gain a layer needs to switch to ``layout`` (see :data:`FEW_BYTES_SPEEDUP`)."""
    if layout == DECODE_LAYOUT and decode_bytes_gain(weight) < MIN_BYTES_GAIN:
        return FEW_BYTES_SPEEDUP
    return MIN_SPEEDUP
