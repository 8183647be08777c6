"""The sparsity study's plain summary: written from the committed full result's verdicts and
numbers, and rewritten when a verdict changes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from convergent.studies import study_summary
from convergent.studies.framework import claims_by_name, misstated_verdicts
from convergent.studies.sparsity import summary

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "sparsity-full"


@pytest.fixture(scope="module")
def payload() -> dict[str, Any]:
    return json.loads((COMMITTED / "results.json").read_text())


def _record(payload: dict[str, Any], part: str) -> dict[str, Any]:
    (record,) = [r for name, r in claims_by_name(payload).items() if part in name]
    return dict(record)


def _rescored(payload: dict[str, Any], part: str, **changes: Any) -> dict[str, Any]:
    """A copy of ``payload`` whose claim named with ``part`` has ``changes`` applied."""
    changed = copy.deepcopy(payload)
    (record,) = [r for r in changed["claims"] if part in r["statement"]]
    record.update(changes)
    return changed


def _texts(payload: dict[str, Any]) -> list[str]:
    return [sentence.text for sentence in summary(payload)]


def test_the_committed_summary_states_its_verdicts_and_key_numbers(payload):
    sentences = summary(payload)
    assert 3 <= len(sentences) <= 5
    assert misstated_verdicts(sentences, payload) == []
    assert [s.text for s in study_summary(payload)] == [s.text for s in sentences]
    scale, language, strength, against_ham, against_adamw = (s.text for s in sentences)
    assert "4-layer vision transformer (width 16)" in scale
    assert "scored on 5 other seeds" in scale
    # the language model: the claim's ratio and interval, then the selected alpha's move ratio
    assert "HORST helped" in language
    assert "0.83 [0.72, 0.95] times AdamW's (reproduced;" in language
    assert "about 22 times as far as its Adam step (alpha 100 with learning rate 0.001" in strength
    assert "learning rate 0.001 was the smallest tried" in strength
    # the vision model: HAM wins, and HORST's mirror step did act
    assert "prefer HAM" in against_ham
    assert "-2.3 [-3.6, -0.94] points (not reproduced)" in against_ham
    assert "acted, moving the weights about 1.1 times" in against_ham
    # AdamW's claims: untested, and why
    assert "stay untested" in against_adamw
    assert "AdamW itself lost only 0.14 points" in against_adamw
    assert "needs at least 3)" in against_adamw
    every_claim = set(claims_by_name(payload))
    assert set().union(*(s.verdicts for s in sentences)) == every_claim


def test_a_language_model_verdict_flipped_rewrites_its_sentences(payload):
    original = _texts(payload)
    flipped = _rescored(
        payload,
        "character LM",
        verdict="not reproduced",
        effect=1.2,
        interval=[1.06, 1.36],
    )
    sentences = summary(flipped)
    assert misstated_verdicts(sentences, flipped) == []
    # the committed sentences no longer hold for the flipped result
    assert misstated_verdicts(summary(payload), flipped) != []
    language, strength = sentences[1].text, sentences[2].text
    assert language != original[1] and strength != original[2]
    assert "HORST did worse than AdamW" in language
    assert "1.2 [1.1, 1.4] times AdamW's (not reproduced;" in language
    assert "HORST helped" not in language
    assert strength.startswith("Keep AdamW for one-shot pruning")
    assert [s.text for s in sentences[3:]] == original[3:]


def test_an_adamw_claim_with_room_states_its_own_verdict(payload):
    record = _record(payload, "accuracy than AdamW")
    checks = [dict(check, passed=True) for check in record["checks"]]
    flipped = _rescored(
        payload,
        "accuracy than AdamW",
        verdict="reproduced",
        effect=0.021,
        interval=[0.012, 0.03],
        checks=checks,
    )
    sentences = summary(flipped)
    assert misstated_verdicts(sentences, flipped) == []
    last = sentences[-1].text
    assert "HORST beat AdamW at 90 %" in last
    assert "2.1 [1.2, 3] points; reproduced)" in last
    # the other AdamW claim stays untested, alone now
    assert "whether HORST loses at most half the accuracy AdamW loses at 80-90 % stays" in last
    assert "whether HORST reaches a higher accuracy" not in last


def test_an_inconclusive_comparison_with_ham_says_the_seeds_cannot_tell(payload):
    flipped = _rescored(
        payload, "than HAM", verdict="inconclusive", effect=-0.004, interval=[-0.02, 0.012]
    )
    sentences = summary(flipped)
    assert misstated_verdicts(sentences, flipped) == []
    against_ham = sentences[3].text
    assert "these seeds cannot tell HORST from HAM" in against_ham
    assert "-0.4 [-2, 1.2] points (inconclusive)" in against_ham
    assert "prefer HAM" not in against_ham


def test_a_language_model_claim_whose_mirror_step_barely_moved_is_untested(payload):
    record = _record(payload, "character LM")
    checks = [dict(check, value=0.05, passed=False) for check in record["checks"]]
    flipped = _rescored(payload, "character LM", verdict="untested", checks=checks)
    flipped["data"]["language"]["move_ratio"]["horst"] = [0.05] * 5
    sentences = summary(flipped)
    assert misstated_verdicts(sentences, flipped) == []
    language, strength = sentences[1].text, sentences[2].text
    assert "only 0.05 times as far as its Adam step (the test needs 0.2)" in language
    assert "(untested;" in language
    assert strength.startswith("A fair test needs a larger alpha")
