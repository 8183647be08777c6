"""The ``sparsity`` study's checks as records, shared by its three parts: their words are format
strings over the fields of a reading, their bounds are declared, and :meth:`CheckWords.check`
turns a reading into a `Check` the same way for every part (the claims are the engine's
`ClaimSpec` records: (a)/(b)'s in :mod:`.claims`, part (c)'s in :mod:`.finetune_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from convergent.diagnostics import acting
from convergent.studies.framework import (
    Check,
    Threshold,
    at_least,
    at_most,
    within,
)
from convergent.studies.sparsity.config import LM_DENSE_TOLERANCE

PRUNER_NAMES = {"magnitude": "magnitude", "wanda": "Wanda", "sparsegpt": "SparseGPT"}
DISPLAY = {"adamw": "AdamW", "ham": "HAM", "horst": "HORST"}


@dataclass(frozen=True)
class CheckWords:
    """A manipulation check declared: ``name`` and ``note`` are format strings over the
    reading's fields; ``required`` the bound."""

    name: str
    required: Threshold
    note: str

    def check(self, value: float, **fields: Any) -> Check:
        """The check at ``value``, its name and note filled with ``fields``."""
        return Check(self.name.format(**fields), value, self.required, self.note.format(**fields))


MOVE = CheckWords(
    "{shown} mirror move / Adam move ({runs})",
    at_least(acting.MOVE_RATIO_FLOOR),
    "below 0.2 the mirror step moves the weights less than a fifth as far as the AdamW step, so "
    "{shown} is AdamW in all but name. Mean over the recorded steps of each of {count} {shown} "
    "run(s), then over the runs{spread}.",
)
ROOM = CheckWords(
    "{shown} loses at least 3 points from dense to {key} (mean over seeds)",
    at_least(0.03),
    "where {shown} barely loses accuracy no optimizer can show a smaller loss: the regime must "
    "leave the baseline room to fail",
)
ACHIEVED = CheckWords(
    "AC/DC reached its targets: largest |achieved - target| ({keys})",
    within(0.0, acting.SPARSITY_TOLERANCE),  # AC/DC's top-k lands within a percent
    "the final AC/DC models must be as sparse as the claim says",
)
FLOOR = CheckWords(
    "each optimizer's selected LM passed the dense-quality floor: its dense validation "
    "perplexity over the best dense one of every grid (largest over the optimizers)",
    at_most(LM_DENSE_TOLERANCE),
    "a point whose dense LM is more than 10 % worse than the best is never selectable; where no "
    "point of a grid passes, the selection falls back to the grid's first point, which nothing "
    "chose",
)
FLOOR_CHECK = FLOOR.name
