"""The verdict logic of the claim record, on constructed inputs with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from convergent.studies.framework.claims import (
    PAIRED_T_INTERVAL,
    VERDICTS,
    Check,
    Threshold,
    at_least,
    at_most,
    claim_from_seeds,
    decide,
    not_measured,
    t_interval,
    within,
)

PASSED = Check("the method acted", 0.5, at_least(0.2))


def test_t_interval_matches_scipy():
    values = [0.012, 0.004, 0.009, -0.002, 0.007]
    expected = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert t_interval(values) == pytest.approx(expected, rel=1e-12)
    assert t_interval(values, confidence=0.9) == pytest.approx(
        stats.t.interval(0.9, 4, loc=np.mean(values), scale=stats.sem(values)), rel=1e-12
    )


def test_t_interval_needs_two_finite_values_and_leaves_out_nan():
    assert t_interval([1.0]) is None
    assert t_interval([1.0, math.nan]) is None
    expected = stats.t.interval(0.95, 2, loc=2.0, scale=stats.sem([1.0, 2.0, 3.0]))
    assert t_interval([1.0, math.nan, 2.0, 3.0]) == pytest.approx(expected)
    with pytest.raises(ValueError, match="confidence must be in"):
        t_interval([1.0, 2.0], confidence=1.5)


@pytest.mark.parametrize(
    ("per_seed", "threshold", "verdict"),
    [
        ([0.020, 0.025, 0.030, 0.022, 0.028], at_least(0.01), "reproduced"),  # above
        ([-0.020, -0.025, -0.030, -0.022, -0.028], at_least(0.01), "not reproduced"),  # below
        ([0.0, 0.02, -0.01, 0.03, 0.01], at_least(0.01), "inconclusive"),  # across
        ([-0.02, -0.01, -0.03, -0.02, -0.025], at_most(0.0), "reproduced"),
        ([0.02, 0.01, 0.03, 0.02, 0.025], at_most(0.0), "not reproduced"),
        ([0.01, -0.01, 0.0, 0.005, -0.005], within(-0.05, 0.05), "reproduced"),
        ([0.10, 0.12, 0.09, 0.11, 0.10], within(-0.05, 0.05), "not reproduced"),
        ([-0.10, -0.12, -0.09, -0.11, -0.10], within(-0.05, 0.05), "not reproduced"),
        ([0.0, 0.08, 0.02, 0.06, 0.04], within(-0.05, 0.05), "inconclusive"),
    ],
)
def test_verdict_follows_the_interval(per_seed, threshold, verdict):
    claim = claim_from_seeds("c", per_seed, threshold, key="toy.claim", unit="u", checks=[PASSED])
    low, high = stats.t.interval(0.95, 4, loc=np.mean(per_seed), scale=stats.sem(per_seed))
    region_low, region_high = threshold.bounds
    # the expectation, written out from the definition
    expected = (
        "reproduced"
        if region_low <= low and high <= region_high
        else "not reproduced"
        if high < region_low or low > region_high
        else "inconclusive"
    )
    assert claim.verdict == expected == verdict
    assert claim.interval == pytest.approx((low, high))
    assert claim.effect == pytest.approx(np.mean(per_seed))
    assert claim.n == 5 and not claim.preview


def test_a_failed_or_unmeasured_check_makes_it_untested_whatever_the_effect():
    per_seed = [0.020, 0.025, 0.030, 0.022, 0.028]
    failed = Check("mirror move / Adam move", 0.016, at_least(0.2))
    missing = not_measured("mirror move / Adam move", at_least(0.2), "not stored")
    for check in (failed, missing):
        claim = claim_from_seeds(
            "c", per_seed, at_least(0.01), key="toy.claim", unit="u", checks=[PASSED, check]
        )
        assert claim.verdict == "untested"
        assert claim.effect == pytest.approx(np.mean(per_seed))  # still shown
    assert failed.passed is False and missing.passed is None and missing.value is None
    assert "not measured: not stored" in missing.note
    assert Check("ratio", 0.5, within(0.1, 1.0)).passed is True
    assert Check("ratio", 1.5, within(0.1, 1.0)).passed is False
    assert Check("ratio", math.nan, within(0.1, 1.0)).passed is None


def test_one_seed_is_a_preview_decided_by_the_point_estimate():
    above = claim_from_seeds(
        "c", [0.03], at_least(0.01), key="toy.claim", unit="u", checks=[PASSED]
    )
    below = claim_from_seeds("c", [0.0], at_least(0.01), key="toy.claim", unit="u", checks=[PASSED])
    assert above.interval is None and above.n == 1 and above.preview
    assert above.verdict == "reproduced" and below.verdict == "not reproduced"
    assert above.label == "reproduced (preview)"
    two = claim_from_seeds(
        "c", [0.03, 0.04], at_least(0.01), key="toy.claim", unit="u", checks=[PASSED]
    )
    assert two.preview and two.interval is not None
    three = claim_from_seeds(
        "c", [0.03, 0.04, math.nan], at_least(0.01), key="toy.claim", unit="u", checks=[PASSED]
    )
    assert three.n == 2 and three.preview  # a diverged seed does not count


def test_no_finite_effect_is_inconclusive():
    assert decide(None, None, at_least(0.0), [PASSED]) == "inconclusive"
    claim = claim_from_seeds(
        "c", [math.nan], at_least(0.0), key="toy.claim", unit="u", checks=[PASSED]
    )
    assert claim.effect is None and claim.verdict == "inconclusive"


def test_json_record_has_the_documented_schema():
    claim = claim_from_seeds(
        "HORST loses at most half of AdamW's accuracy",
        [-0.001, 0.002, 0.0005],
        at_most(0.0),
        key="sparsity.horst_loses_half",
        unit="accuracy (fraction)",
        checks=[Check("mirror move / Adam move", 0.016, at_least(0.2), note="why")],
        evidence="numbers",
        paired=True,
    )
    record = claim.to_json()
    for key in (
        "key",
        "statement",
        "verdict",
        "preview",
        "effect",
        "threshold",
        "interval",
        "n",
        "checks",
    ):
        assert key in record
    assert record["verdict"] in VERDICTS and record["verdict"] == "untested"
    assert record["preview"] is False and record["n"] == 3
    assert record["threshold"] == {"form": "<=", "value": 0.0, "text": "<= 0"}
    assert record["interval_method"] == PAIRED_T_INTERVAL
    assert record["checks"] == [
        {
            "name": "mirror move / Adam move",
            "value": 0.016,
            "required": ">= 0.2",
            "passed": False,
            "note": "why",
        }
    ]
    assert within(-0.05, 0.05).to_json()["value"] == [-0.05, 0.05]


def test_bad_thresholds_are_refused_in_one_sentence():
    with pytest.raises(ValueError, match="threshold form must be"):
        Threshold("==", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs low <= high"):
        within(1.0, 0.0)
    with pytest.raises(ValueError, match="needs one number"):
        Threshold(">=", (0.0, 1.0))


def test_check_design_passes_the_current_design_and_refuses_others_in_one_sentence():
    from convergent.studies.framework import check_design

    check_design("toy", 3, 3)
    with pytest.raises(ValueError) as refused:
        check_design("toy", None, 3)
    assert str(refused.value) == (
        "these toy results are of design 1 (no design number), and this code scores design 3 "
        "only; earlier designs' full results, with the claims they were scored with, are in "
        "docs/results/toy-full/history/"
    )
    with pytest.raises(ValueError, match=r"^these toy results are of design 2, and"):
        check_design("toy", 2, 3)


def test_check_design_scores_a_rescorable_design_as_exploratory():
    from convergent.studies.framework import check_design

    assert check_design("toy", 3, 3, rescorable=(2,)) is False
    assert check_design("toy", 2, 3, rescorable=(2,)) is True
    with pytest.raises(ValueError, match=r"scores design 3 and, exploratory, design 2's data only"):
        check_design("toy", 1, 3, rescorable=(2,))


def test_an_exploratory_claim_says_so_wherever_its_verdict_is_printed():
    from convergent.studies.framework import as_exploratory, at_least, claim_from_seeds
    from convergent.studies.framework.common import claim_rows, compact_claim_rows

    (claim,) = as_exploratory(
        [
            claim_from_seeds(
                "A (here: b)",
                [1.0, 1.1, 1.2],
                at_least(0.0),
                key="toy.claim",
                unit="u",
                revised="r",
            )
        ]
    )
    assert claim.verdict == "reproduced"
    assert claim.label == "reproduced (exploratory)"
    record = claim.to_json()
    assert record["exploratory"] is True and record["revised"] == "r"
    assert "| reproduced (exploratory) |" in compact_claim_rows([record])[2]
    assert "| reproduced (exploratory) |" in claim_rows([record])[2]
    (short,) = as_exploratory(
        [claim_from_seeds("A", [1.0], at_least(0.0), key="toy.claim", unit="u")]
    )
    assert short.label == "reproduced (preview, exploratory)"
    plain = claim_from_seeds(
        "A", [1.0, 2.0, 3.0], at_least(0.0), key="toy.claim", unit="u"
    ).to_json()
    assert "exploratory" not in plain and "revised" not in plain


def _payload(seeds, claims):
    return {"config": {"seeds": seeds}, "claims": claims}


def _record(key, statement, verdict, effect, exploratory=False, revised=""):
    record = {
        "key": key,
        "statement": statement,
        "verdict": verdict,
        "preview": False,
        "effect": effect,
        "interval": [effect - 1, effect + 1],
    }
    if exploratory:
        record["exploratory"] = True
    if revised:
        record["revised"] = revised
    return record


def test_history_lines_put_every_verdict_of_a_claim_side_by_side():
    from convergent.studies.framework import history_lines

    old = _payload(
        [1, 2, 3, 4, 5],
        [
            _record("toy.speeds_up", "Speeds up (here: endpoints)", "reproduced", 2.0),
            _record("toy.dropped", "Dropped claim (here: x)", "inconclusive", 0.5),
        ],
    )
    new = _payload(
        [10, 11, 12, 13, 14],
        [
            # Reworded, same key: the same row.
            _record(
                "toy.speeds_up",
                "Gets faster (here: every step)",
                "not reproduced",
                -3.0,
                revised="why",
            ),
            _record("toy.new", "New claim (here: y)", "reproduced", 4.0),
        ],
    )

    def rescore(payload):
        assert payload is old
        return [_record("toy.speeds_up", "Gets faster", "inconclusive", 0.25, exploratory=True)]

    lines = history_lines(new, 3, [(2, old)], rescore)
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == (
        "| claim (key) | design 2, seeds 1-5, as scored then | design 3's tests on design 2's "
        "seeds 1-5 | design 3's tests on seeds 10-14 | changed in design 3, and why |"
    )
    assert table[2] == (
        "| `toy.speeds_up` | reproduced: 2 [1, 3] | inconclusive (exploratory): 0.25 [-0.75, "
        "1.25] | not reproduced: -3 [-4, -2] | why |"
    )
    assert table[3] == "| `toy.new` | — | — | reproduced: 4 [3, 5] | — |"
    assert "Design 2's claims with no counterpart now: `toy.dropped` (inconclusive: 0.5 " in (
        "\n".join(lines)
    )
    assert history_lines(new, 3, []) == []


def test_history_lines_do_not_repeat_the_current_exploratory_scoring():
    from convergent.studies.framework import history_lines

    old = _payload([1, 2, 3], [_record("toy.claim", "Claim (here: old)", "reproduced", 1.0)])
    now = _payload(
        [1, 2, 3], [_record("toy.claim", "Claim (here: new)", "inconclusive", 0.0, True)]
    )
    lines = history_lines(now, 3, [(2, old)], lambda payload: pytest.fail("rescored twice"))
    assert lines[4].endswith(
        "| design 3's tests on seeds 1-3 (an earlier design's data) "
        "| changed in design 3, and why |"
    )


def test_earlier_designs_reads_plain_and_gzipped_history_files_in_design_order(tmp_path):
    import gzip
    import json

    from convergent.studies.framework import earlier_designs

    history = tmp_path / "history"
    history.mkdir()
    (history / "design10.results.json").write_text(json.dumps({"n": 10}))
    (history / "design2.results.json.gz").write_bytes(gzip.compress(b'{"n": 2}'))
    (history / "notes.txt").write_text("not a design")
    assert earlier_designs(tmp_path) == [(2, {"n": 2}), (10, {"n": 10})]
    assert earlier_designs(tmp_path / "missing") == []


def test_results_of_a_design_the_code_no_longer_scores_are_shown_as_scored_then(tmp_path):
    import json
    import shutil

    from convergent.cli import main
    from convergent.studies import sparsity, study_summary
    from convergent.studies.framework import OtherDesign

    folder = tmp_path / "reports" / "sparsity-old"
    folder.mkdir(parents=True)
    payload = json.loads(Path("docs/results/sparsity-full/results.json").read_text())
    payload["data"]["design"] = 1  # a design no code scores now
    (folder / "results.json").write_text(json.dumps(payload))
    shutil.copy("docs/results/sparsity-full/report.md", folder / "report.md")
    (sentence,) = study_summary(payload)
    assert sentence.text.startswith("These are design 1's results, with the verdicts it was")
    assert sentence.verdicts == {}
    with pytest.raises(OtherDesign) as refused:
        sparsity.claims_from_results(payload)
    assert (refused.value.found, refused.value.current) > (0, 0)
    before = (folder / "results.json").read_bytes()
    assert main(["report", str(tmp_path / "reports"), "--rescore"]) == 0
    assert (folder / "results.json").read_bytes() == before
