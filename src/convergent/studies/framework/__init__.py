"""What every study shares: the claim record and its verdicts, the resumable unit cache and its
numbers' fingerprint, equal-effort tuning, the report files and the README's results section.

A study (``convergent.studies.<name>``) imports this package and the library's public API,
nothing else.
"""

from __future__ import annotations

from convergent.studies.framework.canary import numerics_fingerprint
from convergent.studies.framework.claims import (
    PREVIEW_BELOW,
    VERDICTS,
    Check,
    Claim,
    Threshold,
    at_least,
    at_most,
    check_design,
    claim_from_seeds,
    decide,
    finite_mean,
    finite_or_none,
    format_interval,
    format_number,
    format_percent,
    not_measured,
    stored_number,
    t_interval,
    within,
)
from convergent.studies.framework.common import (
    MODES,
    VERDICT_LEGEND,
    StudyResult,
    check_mode,
    claim_names,
    claim_rows,
    finish,
    json_ready,
    load_study,
    render_markdown,
    results_payload,
    tuning_lines,
    write_study,
)
from convergent.studies.framework.summary import (
    Sentence,
    claims_by_name,
    misstated_verdicts,
    named_verdicts,
    verdict_of,
)
from convergent.studies.framework.tuning import Tuning, TuningData, edge_note, grid_points, tune
from convergent.studies.framework.units import UnitCache, run_jobs, unit_session

__all__ = [
    "MODES",
    "PREVIEW_BELOW",
    "VERDICTS",
    "VERDICT_LEGEND",
    "Check",
    "Claim",
    "Sentence",
    "StudyResult",
    "Threshold",
    "Tuning",
    "TuningData",
    "UnitCache",
    "at_least",
    "at_most",
    "check_design",
    "check_mode",
    "claim_from_seeds",
    "claim_names",
    "claim_rows",
    "claims_by_name",
    "decide",
    "edge_note",
    "finish",
    "finite_mean",
    "finite_or_none",
    "format_interval",
    "format_number",
    "format_percent",
    "grid_points",
    "json_ready",
    "load_study",
    "misstated_verdicts",
    "named_verdicts",
    "not_measured",
    "numerics_fingerprint",
    "render_markdown",
    "results_payload",
    "run_jobs",
    "stored_number",
    "t_interval",
    "tune",
    "tuning_lines",
    "unit_session",
    "verdict_of",
    "within",
    "write_study",
]
