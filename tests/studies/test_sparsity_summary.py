"""The sparsity study's plain summary: written from a design-4 payload's verdicts and numbers
(`sparsity_payload`, scored by the study's own scorer), rewritten when a verdict changes, and
refused for the committed design-2 results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from convergent.studies import study_findings
from convergent.studies.framework import claims_by_key, misstated_verdicts
from convergent.studies.sparsity import summary
from tests.studies.sparsity_payload import PERPLEXITY, design4_payload, scored

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "sparsity-full"


def _texts(payload: dict[str, Any]) -> list[str]:
    return [sentence.text for sentence in summary(payload)]


def test_the_summary_states_its_verdicts_and_key_numbers():
    payload = scored(design4_payload())
    sentences = summary(payload)
    assert len(sentences) == 5
    assert misstated_verdicts(sentences, payload) == []
    assert [s.text for s in study_findings(payload)] == [s.text for s in sentences]
    scale, language, strength, against_ham, against_adamw = (s.text for s in sentences)
    assert "4-layer vision transformer (width 16)" in scale
    assert "by magnitude, Wanda and SparseGPT (Wanda and SparseGPT calibrated on 128" in scale
    assert "to 50, 70 and 90 %" in scale and "scored on 3 other seeds" in scale
    # the one-shot claims: 2 of 6 reproduced (magnitude and SparseGPT at 70 %), each ratio
    assert language.startswith("For a model you will prune once after training, HORST helped")
    assert "helped in 2 of the 6 settings" in language
    assert "0.75 [0.63, 0.87] after magnitude at 70 % (reproduced)" in language
    assert "1.1 [1.1, 1.1] after Wanda at 70 % (not reproduced)" in language
    assert "survive" not in language  # design 4 counts that result once, in SparseGPT at 70 %
    assert "(unpruned: 4.1 against 4)" in language
    # when to use it, and at what strength in HORST's own unit
    assert strength.startswith(
        "Train with HORST a model you will prune once after training with the pruners and "
        "targets where it helped (magnitude at 70 % and SparseGPT at 70 %), at the strength"
    )
    assert "HORST(strength=0.25), which is alpha 100 on these weights" in strength
    assert "learning rate 0.001 (learning rate 0.001 was the smallest tried" in strength
    assert "about 0.6 times as far as its Adam step" in strength
    assert "pass strength=0.25 rather than copying alpha 100" in strength
    # HAM, and the weights near zero in both models
    assert "HORST beat HAM: at 90 % sparsity HORST's top-1 accuracy minus HAM's" in against_ham
    assert "vision-transformer weights were more concentrated near zero" in against_ham
    assert "language-model weights were more concentrated near zero" in against_ham
    assert "acted, moving the weights about 0.3 times" in against_ham
    assert "alpha 3 (strength 0.06) (alpha 3 was the smallest tried" in against_ham
    assert "HORST beat AdamW at 90 %" in against_adamw
    every_claim = set(claims_by_key(payload))
    assert len(every_claim) == 11
    assert set().union(*(s.verdicts for s in sentences)) == every_claim


def test_one_shot_verdicts_flipped_rewrite_the_language_and_strength_sentences():
    original = _texts(scored(design4_payload()))
    payload = design4_payload()
    # every HORST model pruned 1.5 x worse than AdamW's: every one-shot claim not reproduced
    for pruner, by_key in PERPLEXITY["adamw"].items():
        for key, values in by_key.items():
            payload["data"]["language"]["perplexity"]["horst"][pruner][key] = [
                v * f for v, f in zip(values, (1.5, 1.45, 1.55), strict=True)
            ]
    flipped = scored(payload)
    sentences = summary(flipped)
    assert misstated_verdicts(sentences, flipped) == []
    assert misstated_verdicts(summary(scored(design4_payload())), flipped) != []
    language, strength = sentences[1].text, sentences[2].text
    assert "HORST did worse than AdamW in 6 of the 6 settings and helped in none" in language
    assert strength.startswith("Keep AdamW for one-shot pruning: HORST acted (HORST(strength=")
    assert [s.text for s in sentences[3:]] == original[3:]


def test_a_language_model_whose_mirror_step_barely_moved_leaves_every_lm_claim_untested():
    payload = scored(design4_payload(lm_move=0.05))
    sentences = summary(payload)
    assert misstated_verdicts(sentences, payload) == []
    language, strength = sentences[1].text, sentences[2].text
    assert language.startswith("Whether HORST helps a model you will prune once after training")
    assert "only 0.05 times as far as its Adam step (the test needs 0.2)" in language
    assert strength.startswith("A fair test needs a stronger HORST")
    assert "language-model weights sit nearer zero is not known" in sentences[3].text


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            {"ham_move": 0.1},
            "HAM's mirror step moved the weights only 0.1 times as far as its Adam step "
            "(the test needs 0.2)",
        ),
        (
            {"ham_dense": 0.78},
            "HAM itself lost only 2 points of accuracy from unpruned to 90 % (the test needs "
            "at least 3)",
        ),
    ],
)
def test_a_ham_comparison_left_untested_says_why(changes, reason):
    payload = scored(design4_payload(**changes))
    sentences = summary(payload)
    assert misstated_verdicts(sentences, payload) == []
    against_ham = sentences[3].text
    assert against_ham.startswith("Training the vision transformer with AC/DC, HORST against HAM")
    assert reason in against_ham and "(untested)" in against_ham
    assert "HORST beat HAM" not in against_ham


def test_an_adamw_comparison_without_room_stays_untested_and_says_why():
    payload = scored(design4_payload(adamw_dense=0.80))
    last = summary(payload)[-1].text
    assert "whether HORST reaches a higher accuracy than AdamW at 90 % and whether HORST" in last
    assert "stay untested: AdamW itself lost only 2 points" in last


def test_a_selection_outside_the_dense_floor_says_why_the_lm_claims_are_untested():
    payload = scored(design4_payload(adamw_selected_dense=4.7))
    sentences = summary(payload)
    assert misstated_verdicts(sentences, payload) == []
    language = sentences[1].text
    assert language.startswith("Whether HORST helps a model you will prune once after training")
    assert (
        "a selected language model's unpruned validation perplexity was 1.12 times the best "
        "one's (at most 1.1 is selectable), so its selection fell back to a point nothing chose"
        in language
    )


def test_the_design_two_results_in_history_are_refused():
    payload = json.loads((COMMITTED / "history" / "design2.results.json").read_text())
    with pytest.raises(ValueError, match=r"of design 2, and this code scores design 4 only"):
        summary(payload)


def test_the_committed_design_four_summary_names_only_verdicts_its_results_hold():
    payload = json.loads((COMMITTED / "results.json").read_text())
    assert payload["data"]["design"] == 4
    sentences = summary(payload)
    assert 3 <= len(sentences) <= 5
    assert misstated_verdicts(sentences, payload) == []
