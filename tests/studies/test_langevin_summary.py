"""The langevin study's plain summary: the committed full result's sentences (design 7 on seeds
20-24), design 6's runs under design 7's tests (exploratory: the richer case, where the warm
temperature acted), and sentences that follow a changed verdict or a smaller run without
stating a verdict the results do not hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from convergent.studies import EXPLORATORY_SENTENCE, study_findings
from convergent.studies.framework import VERDICTS, claims_by_key, misstated_verdicts
from convergent.studies.langevin import claims_from_results, summary
from convergent.studies.langevin.summary import TemperatureFit
from convergent.studies.langevin.wording import significant
from tests.conftest import copied

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "langevin-full"
WARM_GAP_CREEPS = "langevin.lora_gap_creeps_without_penalty_warm"
BOUNDED = "langevin.attention_norm_bounded_with_penalty"
CALIBRATED_ACCURACY = "langevin.lora_same_accuracy_calibrated"


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return json.loads((RESULTS / "results.json").read_text())


@pytest.fixture(scope="module")
def design6() -> dict[str, Any]:
    """Design 6's full run scored by design 7's tests (exploratory), as committed until design
    7's own run was."""
    payload = json.loads((RESULTS / "history" / "design6.results.json").read_text())
    payload["claims"] = [claim.to_json() for claim in claims_from_results(payload)]
    return payload


def flipped(
    payload: dict[str, Any], name: str, verdict: str, effect: float, interval: list
) -> dict:
    """A copy of ``payload`` whose claim ``name`` holds ``verdict``, ``effect`` and ``interval``."""
    changed = copied(payload)
    record = claims_by_key(changed)[name]
    assert isinstance(record, dict)
    record.update(verdict=verdict, effect=effect, interval=interval)
    return changed


def test_the_committed_summary_states_design_7s_verdicts(committed):
    # Design 7's own run on seeds 20-24: no verdict is exploratory, so no note opens it.
    sentences = summary(committed)
    assert study_findings(committed) == sentences and len(sentences) == 5
    assert misstated_verdicts(sentences, committed) == []
    assert {name for s in sentences for name in s.verdicts} == set(claims_by_key(committed))
    scale, where, norms, decided, unknown = (s.text for s in sentences)
    assert "with 5 seeds" in scale and "(step size 0.01, 3000 to 20000 steps)" in scale
    assert "at s = 0.02 (hot, 2/N), 1.4e-4 (warm" in scale and "1e-6 (calibrated" in scale
    # No temperature acted with the fit kept: the warm one only in some variants.
    assert where.startswith("No tested temperature let Langevin noise change the outcome")
    assert "at the warm temperature (s = 1.4e-4) it acted in some variants only" in where
    assert not where.count("reproduced") and not where.count("untested")
    # lam selected at the warm temperature (the coldest where the noise acted), LoRA's factor
    # on its grid's edge, and the attention run 4.97 relaxation times long where 5 are needed.
    assert "each factor the strongest within 0.5 % of the best validation RMSE at the warm" in norms
    assert "radius factors 8 and 4 for attention, 1.5 and 1.5 (both the grid's edge) for" in norms
    assert "(reproduced: LoRA 3.3 % [-0.3, 6.8])" in norms
    assert (
        "it is untested whether the joint norm of the trained matrices stayed at most 10 % above "
        "the radius the penalty sets (untested: attention, failed check: run steps / radial "
        "relaxation steps 4.97, >= 5 needed)"
    ) in norms
    assert "(reproduced: attention 17-fold [16, 17], LoRA 7.4-fold [6.9, 8])" in norms
    assert decided == (
        "At the warm temperature (s = 1.4e-4), without a penalty the gap did not creep up (not "
        "reproduced: attention -2.8 % [-5.7, 0.13], LoRA -0.98 % [-2.6, 0.69] of the phase-1 "
        "test RMSE)."
    )
    assert "all 6 claims at the hot temperature (s = 0.02) are untested" in unknown
    assert "for LoRA the noise moved some variant's final test RMSE by only 0.36 %" in unknown
    assert "all 6 claims at the calibrated temperature (s = 1e-6) are untested" in unknown


def test_design_6s_runs_under_design_7s_tests_state_their_verdicts_and_where_the_noise_acts(
    design6,
):
    sentences = summary(design6)
    assert len(sentences) == 5
    assert misstated_verdicts(sentences, design6) == []
    # Every claim's verdict is stated, once or more, and declared where it is.
    assert {name for s in sentences for name in s.verdicts} == set(claims_by_key(design6))
    scale, where, norms, decided, unknown = (s.text for s in sentences)
    assert "5 seeds" in scale and "pre-trained on 100 fields" in scale
    assert "at s = 0.02 (hot, 2/N), 1.5e-4 (warm" in scale and "4000 new fields" in scale
    # Where the noise acts, in the library's units, and what it did elsewhere (no verdict).
    assert not where.count("reproduced") and not where.count("untested")
    assert (
        "only at the warm one, s = 1.5e-4 (s/2 = 7.3e-5 in loss units; 140 times the calibrated "
        "s = 4 sigma^2 / (N K), as if the noise variance sigma^2 were 140 times the fit's "
        "training MSE)" in where
    )
    assert "raised the final test RMSE by 1.3 to 8.3 %" in where
    assert "at the hot temperature (s = 0.02) every variant lost its pre-trained fit" in where
    assert "at the calibrated temperature (s = 1.1e-6) the noise moved the final test" in where
    assert norms.startswith("To keep the weights bounded under Langevin noise, add one")
    assert (
        "lam of about 0.0012 (log) and 0.0031 (power) for attention and 0.023 and 0.0022 for "
        "LoRA, in loss units" in norms
    )
    # design 6's lam, selected where the noise moved nothing
    assert "within 0.5 % of the best validation RMSE at the calibrated temperature)" in norms
    assert "(reproduced: attention 3.1 % [1.8, 4.4], LoRA 2.2 % [-0.48, 4.8])" in norms
    assert "(reproduced: attention 16-fold [15, 17], LoRA 10-fold [9.6, 11])" in norms
    # Two-sided accuracy, decided only where the noise acted and the fit held.
    assert decided.startswith("At the warm temperature (s = 1.5e-4), a penalty changed the test")
    assert "at most 5 % either way (reproduced: LoRA -1.8 % [-3.7, 0.11])" in decided
    assert decided.endswith("so what a penalty buys here is bounded weights, not a smaller gap.")
    assert "all 6 claims at the hot temperature (s = 0.02) are untested, because phase 2 lost" in (
        unknown
    )
    assert "all 6 claims at the calibrated temperature (s = 1.1e-6) are untested" in unknown
    assert "by at most 0.15 % of its phase-1 value" in unknown
    assert "attention's claims on the gap with a penalty and accuracy are untested" in unknown
    # The report opens by saying the verdicts are exploratory.
    assert study_findings(design6)[0].text == EXPLORATORY_SENTENCE


def test_a_gap_that_crept_without_a_penalty_rewrites_the_decided_sentence(design6):
    before = summary(design6)[3].text
    changed = flipped(design6, WARM_GAP_CREEPS, "reproduced", 0.03, [0.025, 0.035])
    sentences = summary(changed)
    assert misstated_verdicts(sentences, changed) == []
    assert misstated_verdicts(sentences, design6) != []  # the sentences follow the verdict
    decided = sentences[3]
    assert decided.text != before
    assert "without a penalty the gap crept up (reproduced: LoRA 3 % [2.5, 3.5] of the" in (
        decided.text
    )
    assert "(not reproduced: attention -1.8 % [-2.7, -0.96] of the" in decided.text
    assert "bounded weights, not a smaller gap" not in decided.text
    assert decided.verdicts[WARM_GAP_CREEPS] == "reproduced"


def test_an_unbounded_norm_changes_the_advice(design6):
    changed = flipped(design6, BOUNDED, "not reproduced", 0.3, [0.2, 0.4])
    sentences = summary(changed)
    assert misstated_verdicts(sentences, changed) == []
    norms, decided = sentences[2].text, sentences[3].text
    assert norms.startswith("Whether a penalty keeps the weights bounded is not settled here")
    assert (
        "rose more than 10 % above the radius the penalty sets (not reproduced: attention " in norms
    )
    assert "30 % [20, 40])" in norms and "(reproduced: LoRA 2.2 % [-0.48, 4.8])" in norms
    assert "bounded weights, not a smaller gap" not in decided


def test_a_claim_decided_at_an_unmoved_temperature_leaves_the_unknowns(design6):
    changed = flipped(design6, CALIBRATED_ACCURACY, "inconclusive", 0.04, [0.01, 0.07])
    sentences = summary(changed)
    assert misstated_verdicts(sentences, changed) == []
    decided, unknown = sentences[3].text, sentences[4].text
    assert decided.startswith("At the warm and calibrated temperatures (s = 1.5e-4 and 1.1e-6)")
    assert "it is open whether a penalty changed the test RMSE by at most 5 % either way " in (
        decided
    )
    assert "(inconclusive: LoRA at calibrated 4 % [1, 7])" in decided
    assert "all 6 claims at the calibrated" not in unknown
    assert "LoRA's claims on the gap with a penalty and the gap without one" in unknown


@pytest.mark.parametrize("verdict", VERDICTS)
def test_any_verdict_of_any_claim_is_stated_as_held(committed, design6, verdict):
    for payload, name in [(p, n) for p in (committed, design6) for n in claims_by_key(p)]:
        changed = flipped(payload, name, verdict, 0.5, [0.4, 0.6])
        sentences = summary(changed)
        assert 3 <= len(sentences) <= 5
        assert misstated_verdicts(sentences, changed) == [], name
        assert any(s.verdicts.get(name) == verdict for s in sentences), name


def test_a_one_seed_run_without_the_warm_temperature_says_no_temperature_acted(design6):
    payload = copied(design6)
    payload["config"].update(seeds=[10], claim_temperatures=["hot", "calibrated"])
    payload["data"]["temperatures"].pop("warm")
    for runs in payload["data"]["runs"].values():
        del runs[1:]
        runs[0]["phase2"].pop("warm")
    payload["claims"] = [claim.to_json() for claim in claims_from_results(payload)]
    sentences = summary(payload)
    assert misstated_verdicts(sentences, payload) == []
    assert 3 <= len(sentences) <= 5
    assert "with 1 seed (every verdict a preview)" in sentences[0].text
    assert "at s = 0.02 (hot, 2/N) and 1.1e-6 (calibrated" in sentences[0].text
    assert sentences[1].text.startswith("No tested temperature let Langevin noise change the")
    assert " [" not in sentences[2].text  # one seed: no interval


def test_a_temperature_is_lost_unmoved_acting_or_mixed():
    def fit(train: list[float], moved: list[float]) -> TemperatureFit:
        return TemperatureFit(train=train, moved_by={"an experiment": moved})

    assert fit([1.3, 9.0], [0.5, 0.5]).state(1.25, 0.01) == "lost"
    assert fit([1.0, 1.2], [0.001, 0.009]).state(1.25, 0.01) == "unmoved"
    assert fit([1.0, 1.2], [0.01, 0.08]).state(1.25, 0.01) == "acts"
    assert fit([1.0, 1.3], [0.01, 0.08]).state(1.25, 0.01) == "mixed"
    assert fit([1.0, 1.2], [0.001, 0.08]).state(1.25, 0.01) == "mixed"
    assert fit([1.0, 1.2], []).state(1.25, 0.01) == "mixed"  # no s = 0 run: not shown to act


def test_numbers_are_written_to_two_significant_digits():
    assert [significant(v) for v in (0.02, 1.4589e-4, 16.3, 1680, 16800, -0.0967, 0.0)] == [
        "0.02",
        "1.5e-4",
        "16",
        "1700",
        "1.7e4",
        "-0.097",
        "0",
    ]


def test_an_unmoved_variant_beside_moved_ones_is_named_without_a_contradiction(design6):
    # LoRA's penalty runs at the warm temperature end where their s = 0 controls did, while
    # its unpenalized run moved (about 1.3 % in design 6): the reason names the smallest move,
    # not the largest one over every variant (which exceeds the 1 % needed).
    changed = copied(design6)
    for run in changed["data"]["runs"]["lora"]:
        zero = run["phase2"]["zero"]["none"]["trace"][-1]
        for variant in ("log", "power"):
            for entry in run["phase2"]["warm"][variant]["trace"]:
                if entry["step"] == zero["step"]:
                    entry["test_rmse"] = zero["test_rmse"]
    changed["claims"] = [claim.to_json() for claim in claims_from_results(changed)]
    sentences = summary(changed)
    assert misstated_verdicts(sentences, changed) == []
    unknown = sentences[4].text
    assert (
        "because for LoRA the noise moved some variant's final test RMSE by only 0.025 % of its "
        "phase-1 value against the same run without noise (at least 1 % needed)" in unknown
    )
    warm = unknown.partition("at the warm temperature")[2].partition("; all 6 claims")[0]
    assert "by at most" not in warm


def test_a_failed_check_never_reads_as_meeting_its_need():
    from convergent.studies.langevin.wording import _failed_text

    def text(value):
        return _failed_text({"name": "steps ratio (detail)", "value": value, "required": ">= 5"})

    assert text(4.969) == "steps ratio 4.97, >= 5 needed"
    assert text(4.9996) == "steps ratio 4.9996, >= 5 needed"  # not "5, >= 5 needed"
    assert text(None) == "steps ratio not measured"


def test_a_radius_factor_on_its_grids_edge_is_named_so(design6):
    changed = copied(design6)
    record = changed["data"]["selection"]["lora"]["log"]
    record["selected"] = min(point["radius_factor"] for point in record["grid"])
    norms = next(s.text for s in summary(changed) if "radius factors" in s.text)
    assert "radius factors 8 and 4 for attention, 1.5 (the grid's edge) and 4 for LoRA" in norms
