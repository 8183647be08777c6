"""A claim as a record: its key, statement, threshold, unit and words, declared once.

A study declares each claim it tests as a `ClaimSpec` beside its checks and computes, per seed,
the one number the claim is about; `ClaimSpec.claim` builds the scored claim from the two (the
mean over seeds, its t-interval and verdict: `framework.claim_from_seeds`). Text fields are
format strings over the fields a study passes (a regime's name, a threshold, a count), so a
sentence shown to a user is built from fields, never parsed back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from convergent.studies.framework.claims import Check, Claim, Threshold, claim_from_seeds


@dataclass(frozen=True)
class ClaimSpec:
    """One claim, declared.

    Attributes:
        key: the claim's stable name (``study.snake_case``; a format string over the fields).
        statement: the claim in the paper's terms.
        threshold: where it holds; None where the study's config sets it (given to `claim`).
        unit: what the effect measures.
        evidence: the numbers behind the effect (or given to `claim`, computed).
        revised: what changed in its test since the previous design, and why.
        checks: its manipulation checks, as the study finds them (names or `CheckSpec`s).
        margin: the margin a two-sided claim's resolution is read against.
        paired: the per-seed values are paired differences (the report says so).
    """

    key: str
    statement: str
    threshold: Threshold | None
    unit: str
    evidence: str = ""
    revised: str = ""
    checks: tuple[Any, ...] = ()
    margin: float = 0.0
    paired: bool = False

    def claim(
        self,
        per_seed: Sequence[float],
        checks: Sequence[Check],
        *,
        claim_key: str | None = None,
        claim_threshold: Threshold | None = None,
        claim_evidence: str | None = None,
        extra: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Claim:
        """The claim on ``per_seed`` with ``checks``; its text fields are format strings
        filled with ``fields``. ``key``, ``threshold`` and ``evidence`` replace the declared
        ones (a key built from a regime, a threshold from the config, evidence computed from
        the runs)."""

        def filled(text: str) -> str:
            return text.format(**fields)

        required = claim_threshold or self.threshold
        if required is None:
            raise ValueError(f"claim {self.key} declares no threshold and none was given")
        return claim_from_seeds(
            filled(self.statement),
            per_seed,
            required,
            key=claim_key or filled(self.key),
            unit=filled(self.unit),
            checks=list(checks),
            evidence=filled(self.evidence) if claim_evidence is None else claim_evidence,
            paired=self.paired,
            extra=extra,
            revised=filled(self.revised),
        )
