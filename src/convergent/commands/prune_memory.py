"""Whether a Hugging Face folder is pruned in memory or streamed one block at a time.

With ``low_memory`` left unset (None), ``prune`` estimates what pruning the folder in memory
needs and compares it with the memory available now (``MemAvailable``, through ``psutil``,
which ``accelerate`` requires): when it would not fit, the folder is streamed
(:mod:`convergent.commands.prune_streamed`) and one log line says why, in GiB. The estimate is

    need = weights x (IN_MEMORY_FACTOR + copies) + calibration

where ``weights`` is the bytes of the folder's safetensors tensors in the dtype they are
loaded in, ``copies`` is 1 when several targets are pruned (every target but the last is
pruned on a copy of the model) and 0 for one target, and ``calibration`` the hidden states the
calibration keeps of a block's inputs and outputs: 2 x examples x tokens x hidden size, in
that dtype. ``low_memory=True`` (``--low-memory``) always streams and ``low_memory=False``
(``--no-low-memory``) never does. A folder that cannot be streamed (no ``--save``, several
targets, a sentence encoder, weights not in safetensors files) is pruned in memory, with a
warning when the estimate says it would not fit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from convergent.commands.hf_reading import HFFolderError, architecture_kind, read_config
from convergent.commands.prune_request import PruneRequest, streaming_blocker
from convergent.commands.sentence_embeddings import SENTENCE_EMBEDDING
from convergent.models.streamed import INDEX_FILE, SAFETENSORS_DTYPES, SINGLE_FILE
from convergent.sparse.storage import has_compressed_weights
from convergent.wording import option

logger = logging.getLogger(__name__)

# The in-memory command's peak above its imports, less the calibration states, over the
# weights it loaded (one target, SparseGPT 50 %, Llama d_model 1024, intermediate 2816, float32,
# calibration 32 x 32 tokens: 8 MiB of states): (636 - 8) / 315 MiB = 1.99 at 4 blocks
# (benchmarks/README.md, "The in-memory command against the library call"), (898 - 8) / 511 MiB
# = 1.74 at 8 blocks (benchmarks/streamed_memory.py --d-model 1024 --intermediate 2816
# --heads 16 --blocks --in-memory-blocks 8, this change). Beside the model it holds one block's
# Hessians and factors and the evaluation's data and logits, a smaller share of a larger model,
# so the ratio falls with size and the largest measured one errs on the side of streaming.
IN_MEMORY_FACTOR = 2.0
GIB = 2**30
# Bytes per element of safetensors' dtype names.
ELEMENT_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
# Config keys that name a model's hidden size, by family.
HIDDEN_SIZE_KEYS = ("hidden_size", "n_embd", "d_model", "dim")


@dataclass(frozen=True)
class MemoryEstimate:
    """What pruning a folder in memory needs, against what is available (bytes).

    Attributes:
        weights: the folder's tensors in the dtype they are loaded in.
        copies: the model copies the sweep holds beside it (1 for several targets, else 0).
        calibration: the calibration hidden states (a block's inputs and outputs).
        available: the memory available now (None: unknown).
        dtype: the dtype the weights are counted in, for the message.
    """

    weights: int
    copies: int
    calibration: int
    available: int | None
    dtype: str

    @property
    def need(self) -> float:
        """``weights x (IN_MEMORY_FACTOR + copies) + calibration``."""
        return self.weights * (IN_MEMORY_FACTOR + self.copies) + self.calibration

    @property
    def fits(self) -> bool:
        """Whether the need is within the memory available (unknown: taken to fit)."""
        return self.available is None or self.need <= self.available

    def sentence(self) -> str:
        """``"pruning in memory needs about 9.3 GiB (...) and 4.0 GiB is available"``."""
        copies = f" + {self.copies}" if self.copies else ""
        return (
            f"pruning in memory needs about {self.need / GIB:.1f} GiB ({self.weights / GIB:.1f}"
            f" GiB of {self.dtype} weights x ({IN_MEMORY_FACTOR:g}{copies}) +"
            f" {self.calibration / GIB:.1f} GiB of calibration states) and"
            f" {(self.available or 0) / GIB:.1f} GiB is available"
        )


def available_memory() -> int | None:
    """The memory available to a new allocation now, in bytes (Linux: ``MemAvailable``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def safetensors_tensors(folder: str | Path) -> list[tuple[str, int]] | None:
    """(safetensors dtype name, element count) of each tensor in ``folder``'s safetensors
    weights, from the files' headers alone; None when it has none (nor an index of them)."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        return None
    tensors = []
    for name in files:
        with open(folder / name, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(length))
        for key, entry in header.items():
            if key != "__metadata__":
                count = 1
                for size in entry["shape"]:
                    count *= int(size)
                tensors.append((entry["dtype"], count))
    return tensors


def memory_estimate(
    folder: str | Path,
    request: PruneRequest,
    available: Callable[[], int | None] | None = None,
) -> MemoryEstimate | None:
    """What pruning ``folder`` in memory as ``request`` asks needs, against ``available()``
    (default :func:`available_memory`); None for a folder without safetensors weights."""
    tensors = safetensors_tensors(folder)
    if tensors is None or has_compressed_weights(folder):
        return None
    stored = {code for code, _ in tensors if code in SAFETENSORS_DTYPES}
    dtype = request.dtype or (SAFETENSORS_DTYPES[sorted(stored)[0]] if stored else torch.float32)
    element = torch.empty((), dtype=dtype).element_size()
    weights = sum(
        count * (element if code in SAFETENSORS_DTYPES else ELEMENT_BYTES.get(code, 4))
        for code, count in tensors
    )
    config = read_config(Path(folder)) or {}
    hidden = next((int(config[key]) for key in HIDDEN_SIZE_KEYS if key in config), 0)
    tokens = request.calibration_examples * request.max_length if request.calibrates else 0
    return MemoryEstimate(
        weights=weights,
        copies=1 if len(request.targets) > 1 else 0,
        calibration=2 * tokens * hidden * element,
        available=(available or available_memory)(),
        dtype=str(dtype).removeprefix("torch."),
    )


def chooses_streaming(
    folder: str | Path,
    request: PruneRequest,
    available: Callable[[], int | None] | None = None,
) -> bool:
    """Whether ``folder`` is pruned streamed: as ``request.low_memory`` says, or when it is None,
    when the in-memory estimate exceeds ``available()`` and the folder can be streamed (the
    choice logged, with the figures, at WARNING)."""
    if request.low_memory is not None:
        return request.low_memory
    estimate = memory_estimate(folder, request, available)
    if estimate is None or estimate.fits:
        return False
    blocker = streaming_blocker(request) or _folder_blocker(folder)
    if blocker is not None:
        logger.warning("%s, so it may not fit; it is pruned in memory: %s", estimate.sentence(),
                       blocker)  # fmt: skip
        return False
    logger.warning(
        "%s, so the blocks are streamed from the folder one at a time, as %s does (%s loads the"
        " model whole)",
        estimate.sentence(),
        option("low_memory"),
        option("low_memory", False),
    )
    return True


def _folder_blocker(folder: str | Path) -> str | None:
    """Why the folder itself cannot be streamed (None: it can, as far as its config says)."""
    config = read_config(Path(folder)) or {}
    try:
        kind = architecture_kind(config.get("architectures"))
    except HFFolderError:
        return None  # loading the folder says what is wrong with it
    if kind == SENTENCE_EMBEDDING:
        return "a sentence encoder's embeddings are scored in memory"
    return None
