"""Part (c) of the descent study: the language model's win rate, claims, selection, pilot and
a smoke run end to end."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import statistics
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from convergent.data import DictDataset
from convergent.losses import next_token_labels
from convergent.models import Transformer, TransformerConfig
from convergent.studies.descent import Config, claims_from_results, run_language_pilot, summary
from convergent.studies.descent import language as descent_language
from convergent.studies.descent.config import LanguageConfig
from convergent.studies.descent.language_claims import language_claims
from convergent.studies.descent.measures import sequence_losses, sequence_wins
from convergent.studies.descent.pilot import expected_half_width
from convergent.studies.descent.report import draw_language, language_tables
from convergent.studies.descent.selection import language_score, selected_index
from convergent.studies.descent.study import _language
from convergent.studies.framework import (
    UnitCache,
    claims_by_key,
    json_ready,
    misstated_verdicts,
)
from tests.conftest import assert_drawn_figure
from tests.studies.test_descent import _crossed_by_hand, _payload, design2_rescored


def test_a_win_counts_one_a_tie_half_and_a_loss_nothing():
    erm = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    constrained = [0.5, 2.0, 3.5, 3.9, 5.0, 6.1]
    wins = sequence_wins(erm, constrained)
    assert wins == [1.0, 0.5, 0.0, 1.0, 0.5, 0.0]
    lower = sum(c < e for e, c in zip(erm, constrained, strict=True))
    ties = sum(c == e for e, c in zip(erm, constrained, strict=True))
    assert statistics.fmean(wins) == pytest.approx((lower + ties / 2) / len(erm))  # 0.5
    assert statistics.fmean(sequence_wins(constrained, erm)) == pytest.approx(
        1 - statistics.fmean(wins)
    )  # the other side's rate: the two add to 1
    with pytest.raises(ValueError, match="same sequences"):
        sequence_wins(erm, constrained[:-1])


def test_sequence_losses_are_each_windows_mean_next_token_loss():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(task="lm", vocab_size=11, max_len=6, d_model=8, n_layers=1, causal=True)
    )
    ids = torch.randint(1, 11, (3, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [0] * 3])
    labels = next_token_labels(ids, mask)
    data = DictDataset({"input_ids": ids, "attention_mask": mask, "labels": labels})
    means, perplexity = sequence_losses(model, data, batch_size=2)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    expected, total, count = [], 0.0, 0
    for row in range(3):
        kept = labels[row] != -100
        losses = F.cross_entropy(logits[row][kept], labels[row][kept], reduction="none")
        expected.append(float(losses.mean()))
        total, count = total + float(losses.sum()), count + int(kept.sum())
    assert means == pytest.approx(expected, abs=1e-6)
    assert perplexity == pytest.approx(math.exp(total / count), rel=1e-6)  # token-weighted


def test_pretraining_stops_once_perplexity_gains_under_two_percent_over_two_evaluations():
    assert not descent_language.flattened([100.0, 99.0])  # too few evaluations to judge
    assert not descent_language.flattened([100.0, 90.0, 97.0])  # 3 % over the last two
    assert descent_language.flattened([100.0, 99.0, 98.5])  # 1.5 %
    assert descent_language.flattened([300.0, 100.0, 99.0, 101.0])  # worse than two before


def test_the_held_apart_text_follows_each_novels_pretraining_text():
    pretrain, finetune = descent_language.training_portions()
    starts = descent_language._austen().info["window_starts"]["train"]
    assert len(set(pretrain.tolist()) & set(finetune.tolist())) == 0
    assert len(pretrain) + len(finetune) == len(starts)
    for novel in range(6):
        first = starts[pretrain][starts[pretrain][:, 0] == novel][:, 1]
        second = starts[finetune][starts[finetune][:, 0] == novel][:, 1]
        assert first.max() < second.min()  # the fine-tuning text comes after, in every novel
        assert len(second) / (len(first) + len(second)) == pytest.approx(1 / 3, abs=0.01)
    assert descent_language.spaced(torch.arange(10), 4).tolist() == [0, 2, 5, 7]
    assert descent_language.spaced(torch.arange(3), None).tolist() == [0, 1, 2]


def test_language_settings_declare_equal_grids_and_the_claims_gamma():
    full = Config.for_mode("full").language
    sizes = {len(list(itertools.product(*axes.values()))) for axes in full.grids().values()}
    assert sizes == {8} and full.steps == 300 and 1.5 in full.gammas
    assert full.gammas == (0.5, 1.0, 1.5, 2.0) and full.selection_gamma == 1.5
    assert Config.for_mode("quick").run_language and Config.for_mode("smoke").run_language
    with pytest.raises(ValueError, match="both language grids must have the same number"):
        LanguageConfig(alphas=(0.05, 0.2))
    with pytest.raises(ValueError, match=r"must include 1\.5"):
        LanguageConfig(gammas=(0.5, 1.0))
    with pytest.raises(ValueError, match="every language cost must be > 0"):
        LanguageConfig(costs=(0.0, None))
    point = {"lr": 3e-4, "alpha": 0.05, "resilient_cost": None}
    assert full.options("constrained", point) == {
        "lr": 3e-4,
        "weight_decay": 0.01,
        "alpha": 0.05,
        "resilient_cost": None,
    }
    erm = full.options("erm", {"lr": 1e-3, "weight_decay": 0.3})
    assert erm["alpha"] == 0.0 and erm["weight_decay"] == 0.3


def test_the_language_selection_is_the_denoisers_rule_on_perplexity():
    def unit(clean: float, noisy: float, peak: float | None, share: float | None) -> dict:
        return {
            "validation_perplexity": clean,
            "validation_noisy_perplexity": noisy,
            "multiplier_max": peak,
            "multiplier_active_share": share,
        }

    grid = [
        unit(40.0, 60.0, 0.05, 0.5),  # best clean, but its constraints do not act
        unit(41.0, 58.0, 0.5, 0.5),  # acts: sets the floor, 41 x 1.01 = 41.41
        unit(41.4, 55.0, 0.3, 0.9),  # acts, within 1 %: selected
        unit(41.5, 50.0, 0.3, 0.9),  # acts, beyond 1 %
    ]
    score = language_score(grid, tolerance=0.01)
    assert [math.isnan(score(u)) for u in grid] == [True, False, False, True]
    assert selected_index(grid, score) == 2
    erm = [{**u, "multiplier_max": None, "multiplier_active_share": None} for u in grid]
    score = language_score(erm, tolerance=0.01)  # no constraints: every point, floor 40.4
    assert [math.isnan(score(u)) for u in erm] == [False, True, True, True]


# Per-window test losses of three made-up seeds, clean and at the two gammas (0.5, 1.5).
ERM = (
    [3.0, 3.2, 2.9, 3.5, 3.1, 3.3],
    [3.1, 3.1, 3.0, 3.4, 3.0, 3.2],
    [3.0, 3.3, 2.8, 3.6, 3.2, 3.3],
)
CONSTRAINED = (
    [2.9, 3.2, 3.0, 3.4, 3.2, 3.2],
    [3.2, 3.0, 3.1, 3.3, 3.0, 3.3],
    [3.0, 3.2, 2.9, 3.5, 3.1, 3.4],
)


def _language_data(active: float = 0.5) -> dict[str, Any]:
    def record(seed, losses, shift, perplexity, start, layers, method):
        return {
            "seed": seed,
            "perplexity": perplexity,
            "start_perplexity": start,
            "gaussian": [perplexity + 1, perplexity + 3 + shift],
            "sequence_losses": losses,
            "noisy_sequence_losses": [
                [v + 0.1 for v in losses],
                [v + 0.5 + shift * (i % 2) for i, v in enumerate(losses)],
            ],
            "layer_losses": layers,
            "multiplier_max": 0.4 if method == "constrained" else None,
            "multiplier_active_share": active if method == "constrained" else None,
            "multipliers": [0.1],
            "fraction_satisfied": 1.0,
            "train_fraction_satisfied": 1.0,
        }

    bumpy, smooth = [8.0, 5.0, 5.2, 4.0], [8.0, 5.0, 4.6, 4.0]
    return {
        "gammas": [0.5, 1.5],
        "runs": {
            "erm": [
                record(s, ERM[i], 0.0, 22.0, 23.0, bumpy, "erm") for i, s in enumerate((21, 22, 23))
            ],
            "constrained": [
                record(s, CONSTRAINED[i], -0.3, 22.5, 23.0, smooth, "constrained")
                for i, s in enumerate((21, 22, 23))
            ],
        },
        "selected": {"erm": {}, "constrained": {"alpha": 0.2, "resilient_cost": 10.0}},
    }


def test_the_language_claims_follow_their_formulas():
    language = _language_data()
    clean, noisy, monotone = language_claims(language)
    # Clean: per window 1 for a lower constrained loss, 1/2 for a tie, per seed the mean.
    table = [
        [
            1.0 if c < e else 0.5 if c == e else 0.0
            for e, c in zip(ERM[s], CONSTRAINED[s], strict=True)
        ]
        for s in range(3)
    ]
    assert list(clean.per_seed) == pytest.approx([sum(row) / 6 for row in table])
    assert clean.interval == pytest.approx(_crossed_by_hand(table))  # windows and seeds
    assert clean.threshold.form == "within" and clean.threshold.value == (0.45, 0.55)
    assert "windows and seeds" in clean.interval_method
    # The fit check: ERM's test perplexity over its start's, 22 / 23, largest over seeds.
    fit = clean.checks[-1]
    assert fit.value == pytest.approx(22 / 23) and fit.passed
    # Noisy, at gamma 1.5 (the second level): the constrained losses drop 0.3 on odd windows.
    noisy_table = [
        [
            1.0 if c < e else 0.5 if c == e else 0.0
            for e, c in zip(
                [v + 0.5 for v in ERM[s]],
                [v + 0.5 - 0.3 * (i % 2) for i, v in enumerate(CONSTRAINED[s])],
                strict=True,
            )
        ]
        for s in range(3)
    ]
    assert list(noisy.per_seed) == pytest.approx([sum(row) / 6 for row in noisy_table])
    assert noisy.threshold.form == ">=" and noisy.threshold.value == pytest.approx(0.55)
    assert noisy.interval == pytest.approx(_crossed_by_hand(noisy_table))
    assert noisy.extra["resolution"]["margin"] == 0.05
    # Monotone, as part (a)'s: the constrained rises (4.6 / 5 - 1 < 0), ERM's bump 4 %.
    assert list(monotone.per_seed) == pytest.approx([4.6 / 5 - 1] * 3)
    assert monotone.checks[-1].value == 1.0 and monotone.verdict == "reproduced"
    assert all(claim.statement.startswith("(c) ") for claim in (clean, noisy, monotone))
    # Constraints active in 10 % of the steps: every part (c) claim is untested.
    quiet = language_claims(_language_data(active=0.1))
    assert [claim.verdict for claim in quiet] == ["untested"] * 3


def test_part_c_claims_come_with_part_c_data_only():
    without = claims_from_results(_payload())
    assert not any(claim.statement.startswith("(c)") for claim in without)
    design2 = design2_rescored()  # no part (c)
    assert not any(claim.statement.startswith("(c)") for claim in claims_from_results(design2))
    payload = _payload()
    payload["data"]["language"] = _language_data()
    with_c = claims_from_results(payload)
    assert len(with_c) == len(without) + 3
    assert [c.to_json() for c in with_c[: len(without)]] == [c.to_json() for c in without]


def _smoke() -> Config:
    return Config.for_mode("smoke")


def _no_test(*args: Any) -> Any:
    raise AssertionError("a selection run asked for the test windows")


def test_a_language_grid_run_reads_no_test_window(monkeypatch):
    config = _smoke()
    read: list[str] = []
    windows = descent_language.language_windows

    def recording(split: str, *args: Any) -> DictDataset:
        read.append(split)
        return windows(split, *args)

    monkeypatch.setattr(descent_language, "language_windows", recording)
    monkeypatch.setattr(descent_language, "language_test_data", _no_test)
    start = descent_language.pretrain_unit(config)["state"]
    point = {"lr": 1e-3, "weight_decay": 0.01}
    unit = descent_language.language_unit(config, "erm", point, 30, False, start)
    assert math.isfinite(unit["validation_noisy_perplexity"]) and set(read) == {"validation"}
    with pytest.raises(AssertionError, match="asked for the test windows"):
        descent_language.language_unit(config, "erm", point, 30, True, start)


def test_the_language_pilot_reads_validation_only_and_erm_only(monkeypatch, tmp_path):
    base = dataclasses.replace(
        _smoke(),
        seeds=(21, 22, 23, 24, 25),  # the projection is to the study's five final seeds
        language=dataclasses.replace(
            _smoke().language, erm_weight_decays=(0.01, 0.1), costs=(10.0, None)
        ),
    )
    jobs: list[Any] = []
    unit = descent_language.language_unit

    def recording(config: Any, method: str, point: Any, seed: int, final: bool, start: Any):
        jobs.append((method, final, seed))
        return unit(config, method, point, seed, final, start)

    monkeypatch.setattr(descent_language, "language_test_data", _no_test)
    monkeypatch.setattr(descent_language, "language_unit", recording)
    result = run_language_pilot(tmp_path, workers=1, log=lambda line: None, base=base)
    assert {(method, final) for method, final, _ in jobs} == {("erm", False)}
    assert {seed for *_, seed in jobs} == {30, 31, 32} and len(jobs) == 2 + 2
    assert len(result["largest_rise"]) == 3 and 0 <= result["bump_share"] <= 1
    assert json.loads((tmp_path / "language_pilot.json").read_text())["seeds"] == [30, 31, 32]
    clean = result["resolution"]["clean"]
    assert len(clean["erm_against_erm_win_rates"]) == 3  # the pairs of three runs
    spread = math.sqrt(statistics.fmean((r - 0.5) ** 2 for r in clean["erm_against_erm_win_rates"]))
    assert clean["seed_sd"] == pytest.approx(spread)
    assert clean["expected_half_width"] == pytest.approx(expected_half_width(spread, 5, 32))


def test_the_expected_half_width_adds_the_seed_spread_to_the_windows():
    # 783 windows, 5 seeds, no seed spread: t_(0.975, 4) x sqrt(0.25 / 3915).
    assert expected_half_width(0.0, 5, 783) == pytest.approx(
        stats.t.ppf(0.975, 4) * math.sqrt(0.25 / 3915)
    )
    wider = expected_half_width(0.03, 5, 783)
    assert wider == pytest.approx(stats.t.ppf(0.975, 4) * math.sqrt(0.03**2 / 5 + 0.25 / 3915))
    assert expected_half_width(0.04, 5, 783) > 0.05 > wider  # the 5-point margin's edge


def test_part_c_runs_end_to_end_in_smoke_mode(tmp_path):
    config = _smoke()
    cache = UnitCache(tmp_path / "units", "descent", json_ready(config), design=1)
    language = _language(config, cache, lambda line: None, "criterion")
    shown = json_ready({key: value for key, value in language.items() if key != "tunings"})
    assert shown["pretraining"]["steps"] == config.language.pretrain_steps
    assert "state" not in shown["pretraining"] and len(shown["pretraining"]["curve"]) == 2
    for method in ("erm", "constrained"):
        (record,) = shown["runs"][method]
        assert len(record["sequence_losses"]) == config.language.test_windows
        assert len(record["noisy_sequence_losses"]) == len(config.language.gammas)
        assert len(record["layer_losses"]) == config.language.layers + 1
        assert record["perplexity"] > 1 and record["start_perplexity"] > 1
        (point,) = shown["selection"][method]
        assert "validation_sequence_losses" not in point  # kept in the unit, not the report
    claims = language_claims(shown)
    assert len(claims) == 3 and all(claim.n == 1 for claim in claims)
    assert all(check.passed is not None for claim in claims for check in claim.checks)
    erm, constrained = shown["runs"]["erm"][0], shown["runs"]["constrained"][0]
    wins = sequence_wins(erm["sequence_losses"], constrained["sequence_losses"])
    assert claims[0].effect == pytest.approx(statistics.fmean(wins))
    tables = language_tables(shown)
    rows = tables[
        "(c) win rate against ERM and test perplexity by Gaussian embedding noise (gamma)"
    ]
    assert [row["gamma"] for row in rows] == [0.0, 1.5]
    assert rows[0]["win rate (constrained over ERM)"] == f"{claims[0].effect:.3f}"
    assert_drawn_figure(tmp_path / draw_language(shown, tmp_path))


def _with_part_c(payload: dict[str, Any], verdicts: dict[str, str] | None = None) -> dict:
    """``payload`` (no part (c)) with made-up part (c) claims, data and config added."""
    extended = copy.deepcopy(payload)
    language = _language_data()
    extended["data"]["language"] = language
    extended["config"]["language"] = json_ready(Config.for_mode("full").language)
    claims = [claim.to_json() for claim in language_claims(language)]
    for claim in claims:
        if verdicts and claim["key"] in verdicts:
            claim["verdict"] = verdicts[claim["key"]]
    extended["claims"] = [*extended["claims"], *claims]
    return extended


LANGUAGE_CLEAN = "descent.language_clean_win_rate_even"
LANGUAGE_NOISE = "descent.language_noisy_win_rate_above_half"


def test_the_summary_keeps_five_sentences_with_part_c():
    payload = design2_rescored()
    before = summary(payload)
    extended = _with_part_c(payload)
    sentences = summary(extended)
    assert len(before) == len(sentences) == 5
    assert misstated_verdicts(sentences, extended) == []
    assert [s.text for s in sentences[:3]] == [s.text for s in before[:3]]
    merged, language = sentences[3].text, sentences[4].text
    assert merged.startswith(before[3].text.rstrip(".")) and "; on text, " in merged
    assert set(sentences[3].verdicts) == set(before[3].verdicts) | set(before[4].verdicts)
    claims = claims_by_key(extended)
    clean = claims[LANGUAGE_CLEAN]
    assert f"won {100 * clean['effect']:.0f} % of the test windows" in language
    assert "4-layer GPT-style language model" in language and "(3 seeds)" in language
    assert f"({clean['verdict']})" in language
    assert "per-layer losses fell layer by layer where ERM's did not (reproduced)" in language
    reproduced = _with_part_c(payload, {LANGUAGE_NOISE: "reproduced"})
    text = summary(reproduced)[4].text
    assert "clearing the test's 55 % (reproduced; the paper: 69.93 %)" in text
    assert "worth trying" in text and misstated_verdicts(summary(reproduced), reproduced) == []
    # What a user who fine-tunes a language model should do follows the two win rates.
    for noise, clean, win, advice in (
        ("reproduced", "reproduced", 0.5, "without noise it cost no more than 5 points"),
        ("reproduced", "not reproduced", 0.4, "lost without it, so use it only where inputs"),
        ("reproduced", "not reproduced", 0.6, "where inputs are noisy, constrained fine-tuning"),
        ("not reproduced", "reproduced", 0.5, "stayed below the test's 55 %, so plain"),
        ("inconclusive", "inconclusive", 0.5, "stays open at this scale"),
    ):
        changed = _with_part_c(payload, {LANGUAGE_NOISE: noise, LANGUAGE_CLEAN: clean})
        claims_by_key(changed)[LANGUAGE_CLEAN]["effect"] = win
        assert advice in summary(changed)[4].text, (noise, clean, win)
        assert misstated_verdicts(summary(changed), changed) == []
    untested = _with_part_c(payload, {LANGUAGE_NOISE: "untested"})
    assert not any(a in summary(untested)[4].text for a in ("simpler", "worth", "open at"))


def test_the_summary_says_when_part_c_constraints_did_not_bind():
    payload = _with_part_c(design2_rescored())
    quiet = [claim.to_json() for claim in language_claims(_language_data(active=0.1))]
    payload["claims"] = [*payload["claims"][:-3], *quiet]
    sentences = summary(payload)
    assert misstated_verdicts(sentences, payload) == []
    assert (
        "barely bound" in sentences[4].text and "its three claims are untested" in sentences[4].text
    )


def test_a_fine_tunes_key_changes_with_its_pretrained_start_and_only_with_it():
    start = {"b.weight": torch.ones(2, 3), "a.bias": torch.zeros(3)}

    def key(weights: dict[str, torch.Tensor]) -> Any:
        return descent_language.fine_tunes(_smoke(), weights)("erm", {"lr": 1e-3}, 30, False).key

    same = {name: tensor.clone() for name, tensor in reversed(list(start.items()))}
    nudged = {**start, "a.bias": torch.tensor([0.0, 0.0, 1e-7])}
    # The committed units' key: the run's fields and the start's digest.
    fields = {"part": "language", "method": "erm", "lr": 1e-3, "seed": 30, "final": False}
    assert {k: v for k, v in key(start).items() if k != "start"} == fields
    assert list(key(start)) == [*fields, "start"]
    assert key(start) == key(same)
    assert key(start) != key(nudged)
    assert key(start) != key({**start, "a.bias": start["a.bias"][:2]})
    with pytest.raises(ValueError, match="needs the pretrained weights"):
        key({})
